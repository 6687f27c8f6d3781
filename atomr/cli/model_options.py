"""`--model`: the MLP (the default) or a GPT, and the GPT's own flags.

`atomr train --model gpt` trains a character-level GPT on the Python
documentation that ships with the interpreter (`--dataset pydoc`, the GPT's
only and default data set) for 2 epochs unless told otherwise, and prints a
sample of generated text at the end.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from atomr.cli.errors import CliError
from atomr.train.core.model import gpt

__all__ = ["GPT_FLAGS", "GptShape", "add_model_arguments", "resolve_model"]

MODELS = ("mlp", "gpt")

GPT_FLAGS = {"context": 64, "n_layer": 2, "n_head": 4, "d_model": 64, "dropout": 0.0}
"""The GPT's flags (as attribute names) and their defaults."""


@dataclass(frozen=True)
class GptShape:
    """The GPT of a run (`atomr.train.core.model.gpt`'s arguments)."""

    context: int
    n_layer: int
    n_head: int
    d_model: int
    dropout: float

    def build(self, vocab: int, seed: int) -> Any:
        """The model, for a vocabulary of `vocab` characters."""
        return gpt(vocab, self.context, n_layer=self.n_layer, n_head=self.n_head,
                   d_model=self.d_model, dropout=self.dropout, seed=seed)  # fmt: skip


def add_model_arguments(group: Any) -> None:
    """`--model` and the GPT flags, in the parser's model group."""
    group.add_argument(
        "--model",
        choices=MODELS,
        default="mlp",
        help="mlp (default; --hidden, --activation) or gpt: a character-level GPT on the "
        "Python documentation, which prints a generated sample at the end",
    )
    helps = {
        "context": "characters per sequence",
        "n_layer": "transformer blocks",
        "n_head": "attention heads",
        "d_model": "width",
        "dropout": "dropout probability",
    }
    for name, default in GPT_FLAGS.items():
        group.add_argument(
            "--" + name.replace("_", "-"),
            type=type(default),
            default=None,
            help=f"--model gpt: {helps[name]} (default: {default})",
        )


def resolve_model(args: argparse.Namespace) -> GptShape | None:
    """Check the model flags and fill in the model's defaults (`--epochs`,
    `--dataset`) in `args`; the GPT's shape, or None for the MLP.

    Raises:
        CliError: a GPT flag without `--model gpt`, a data set the model
            cannot take, or a GPT size out of range.
    """
    given = {name: getattr(args, name) for name in GPT_FLAGS}
    if args.model == "mlp":
        for name, value in given.items():
            if value is not None:
                raise CliError(f"--{name.replace('_', '-')} only applies to --model gpt")
        args.epochs = 20 if args.epochs is None else args.epochs
        args.dataset = "digits" if args.dataset is None else args.dataset
        if args.dataset == "pydoc":
            raise CliError("--dataset pydoc is text: train it with --model gpt")
        return None
    args.epochs = 2 if args.epochs is None else args.epochs
    args.dataset = "pydoc" if args.dataset is None else args.dataset
    if args.dataset != "pydoc":
        raise CliError(f"--model gpt trains on --dataset pydoc, not {args.dataset}")
    if args.loss != "cross_entropy":
        raise CliError("--model gpt trains with --loss cross_entropy")
    value = {k: GPT_FLAGS[k] if v is None else v for k, v in given.items()}
    shape = GptShape(
        int(value["context"]),
        int(value["n_layer"]),
        int(value["n_head"]),
        int(value["d_model"]),
        float(value["dropout"]),
    )
    for name in ("context", "n_layer", "n_head", "d_model"):
        if getattr(shape, name) < 1:
            raise CliError(f"--{name.replace('_', '-')} must be >= 1")
    if shape.d_model % shape.n_head:
        raise CliError(f"--n-head {shape.n_head} must divide --d-model {shape.d_model}")
    if not 0.0 <= shape.dropout < 1.0:
        raise CliError(f"--dropout must be in [0, 1), got {shape.dropout}")
    return shape
