"""`atomr train`'s optimizer flags hold the library's rules: a value the
library takes (`OptimizerKind`, `TrainerConfig`, `gpt`'s dropout) the
command takes, and one it refuses the command refuses, naming the flag."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from atomr.cli.errors import CliError
from atomr.cli.parser import build_parser
from atomr.cli.run_config import RunConfig
from atomr.train import LossKind, OptimizerKind, TrainerConfig
from atomr.train.core.model import gpt

VALUES = [-1.0, 0.0, 1e-50, 0.5, 0.999, 1.0, 1.5, 3e38, 1e39, math.inf, math.nan]


def _command_takes(*argv: str) -> RunConfig | None:
    try:
        return RunConfig.from_args(build_parser("test").parse_args(["train", *argv]))
    except CliError:
        return None


def _library_takes(build: Callable[[], object]) -> bool:
    try:
        result = build()
        if isinstance(result, OptimizerKind):
            result.check_dtype(np.float32)  # the command's models are float32
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("value", VALUES)
def test_momentum_is_taken_where_the_optimizer_takes_it(value: float) -> None:
    """`--momentum 1.5` was refused ('must be in [0, 1)'), which
    `OptimizerKind.sgd(momentum=1.5)` (and torch) take."""
    run = _command_takes("--optimizer", "sgd", "--momentum", str(value))
    assert (run is not None) == _library_takes(lambda: OptimizerKind.sgd(0.05, momentum=value))
    if run is not None:
        assert run.trainer_config().optimizer == OptimizerKind.sgd(0.05, momentum=value)


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw"])
@pytest.mark.parametrize("value", VALUES)
def test_lr_is_taken_where_the_optimizer_takes_it(optimizer: str, value: float) -> None:
    """`--lr 0` was refused, which every `OptimizerKind` takes."""
    run = _command_takes("--optimizer", optimizer, "--lr", str(value))
    build = getattr(OptimizerKind, optimizer)
    assert (run is not None) == _library_takes(lambda: build(value))
    if run is not None:
        assert run.trainer_config().optimizer.lr == value


@pytest.mark.parametrize("value", VALUES)
def test_clip_is_taken_where_the_trainer_config_takes_it(value: float) -> None:
    run = _command_takes("--clip", str(value))
    kind = OptimizerKind.adam(0.005)
    assert (run is not None) == _library_takes(
        lambda: TrainerConfig(kind, LossKind.CROSS_ENTROPY, gradient_clip=value)
    )


@pytest.mark.parametrize("value", VALUES)
def test_dropout_is_taken_where_the_gpt_takes_it(value: float) -> None:
    run = _command_takes("--model", "gpt", "--dropout", str(value))
    assert (run is not None) == _library_takes(
        lambda: gpt(8, 4, n_layer=1, n_head=1, d_model=4, dropout=value)
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--lr", "-1"], "--lr: lr must be >= 0, got lr=-1.0"),
        (["--optimizer", "sgd", "--momentum", "-1"], "--momentum: momentum must be >= 0"),
        (["--optimizer", "sgd", "--momentum", "1e39"], "--momentum: sgd cannot compute in float32"),
        (["--clip", "inf"], "--clip: gradient_clip must be positive and finite, got inf"),
    ],
)
def test_a_refusal_names_the_flag_and_the_library_s_reason(argv: list[str], message: str) -> None:
    with pytest.raises(CliError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        RunConfig.from_args(build_parser("test").parse_args(["train", *argv]))
