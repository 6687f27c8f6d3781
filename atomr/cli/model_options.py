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

from atomr.accel import ACTIVATIONS
from atomr.cli.errors import CliError, count_flag
from atomr.train.core.model import gpt
from atomr.train.core.model.structure import drop_probability

__all__ = [
    "GPT_FLAGS",
    "MLP_FLAGS",
    "GptShape",
    "add_model_arguments",
    "flag_of",
    "resolve_model",
]

MODELS = ("mlp", "gpt")

MLP_FLAGS = {"hidden": "128", "activation": "relu"}
"""The MLP's flags (as attribute names) and their defaults."""

GPT_FLAGS = {"context": 64, "n_layer": 2, "n_head": 4, "d_model": 64, "dropout": 0.0}
"""The GPT's flags (as attribute names) and their defaults."""

_FLAGS_OF: dict[str, dict[str, Any]] = {"mlp": MLP_FLAGS, "gpt": GPT_FLAGS}
"""Each model's own flags: given with the other model, they are refused."""

_MLP_ACTIVATIONS = tuple(name for name in ACTIVATIONS if name != "identity")
"""`--activation`'s choices: the kernels' activations (one table,
`atomr.accel.ACTIVATIONS`) but the identity, which would make the MLP linear."""


def flag_of(name: str) -> str:
    """The command-line flag of an option's attribute name: `n_layer` -> `--n-layer`."""
    return "--" + name.replace("_", "-")


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
    """`--model`, the MLP flags and the GPT flags, in the parser's model group
    (each defaults to None: `resolve_model` tells given from not given)."""
    group.add_argument(
        "--model",
        choices=MODELS,
        default="mlp",
        help="mlp (default; --hidden, --activation) or gpt: a character-level GPT on the "
        "Python documentation, which prints a generated sample at the end",
    )
    group.add_argument(
        "--hidden",
        default=None,
        metavar="W[,W...]",
        help=f"--model mlp: hidden layer widths, comma separated (default: {MLP_FLAGS['hidden']})",
    )
    group.add_argument(
        "--activation",
        choices=_MLP_ACTIVATIONS,
        default=None,
        help=f"--model mlp: the hidden layers' activation (default: {MLP_FLAGS['activation']})",
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
            flag_of(name),
            type=type(default),
            default=None,
            help=f"--model gpt: {helps[name]} (default: {default})",
        )


def _refuse_other_models_flags(args: argparse.Namespace) -> None:
    """A flag of one model given with the other is an error.

    Raises:
        CliError: naming the flag and the model it applies to.
    """
    for model, flags in _FLAGS_OF.items():
        if model == args.model:
            continue
        for name in flags:
            if getattr(args, name) is not None:
                raise CliError(f"{flag_of(name)} only applies to --model {model}")


def _gpt_shape(args: argparse.Namespace) -> GptShape:
    """The GPT's shape from its flags, defaults filled in.

    Raises:
        CliError: a size below 1 or beyond `INDEX_MAX`, `--n-head` not
            dividing `--d-model`, or
            `--dropout` outside [0, 1).
    """
    value = {k: d if getattr(args, k) is None else getattr(args, k) for k, d in GPT_FLAGS.items()}
    shape = GptShape(
        int(value["context"]),
        int(value["n_layer"]),
        int(value["n_head"]),
        int(value["d_model"]),
        float(value["dropout"]),
    )
    for name in ("context", "n_layer", "n_head", "d_model"):
        count_flag(flag_of(name), getattr(shape, name))
    if shape.d_model % shape.n_head:
        raise CliError(f"--n-head {shape.n_head} must divide --d-model {shape.d_model}")
    try:
        drop_probability("--dropout", shape.dropout)  # the model's own rule
    except ValueError as exc:
        raise CliError(str(exc)) from None
    return shape


def resolve_model(args: argparse.Namespace) -> GptShape | None:
    """Check the model flags and fill in the model's defaults (`--epochs`,
    `--dataset`, and the MLP's `--hidden` and `--activation`, which a GPT run
    records unused) in `args`; the GPT's shape, or None for the MLP.

    Raises:
        CliError: a flag of the other model (an MLP flag with `--model gpt`,
            a GPT flag without it), a data set the model cannot take, or a
            GPT size out of range.
    """
    _refuse_other_models_flags(args)
    for name, default in MLP_FLAGS.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    if args.model == "mlp":
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
    return _gpt_shape(args)
