"""`--optimizer`, `--lr`, `--momentum`, `--loss` and `--clip`: the run's
update rule (`update_rule`), checked by the library's own rules
(`OptimizerKind`, `TrainerConfig`), so that the command takes exactly what
the library takes (`checked_lr_and_momentum`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from atomr.cli.errors import CliError
from atomr.train import LossKind, OptimizerKind, TrainerConfig

__all__ = ["DEFAULT_MOMENTUM", "checked_lr_and_momentum", "default_lr", "update_rule"]

DEFAULT_MOMENTUM = 0.9
"""`--momentum` when not given (`--optimizer sgd`)."""

_MODEL_DTYPE = np.float32
"""The dtype of the command's models (the `Mlp`'s and `gpt`'s default): the
optimizer's values must be usable in it (`OptimizerKind.check_dtype`)."""


def default_lr(optimizer: str) -> float:
    """The learning rate used when `--lr` is not given.

    Args:
        optimizer: "sgd", "adam" or "adamw".

    Returns:
        0.05 for SGD (with momentum 0.9), 0.005 for Adam and AdamW.
    """
    return 0.05 if optimizer == "sgd" else 0.005


def update_rule(
    optimizer: str, lr: float, momentum: float, loss: str, clip: float | None, **more: Any
) -> TrainerConfig:
    """The `TrainerConfig` of `--optimizer`, `--lr`, `--momentum` (SGD's
    alone), `--loss` and `--clip`, with `more` of its fields (a schedule,
    `max_steps`).

    Raises:
        TypeError, ValueError: as `OptimizerKind`'s builders and `TrainerConfig`.
    """
    if optimizer == "sgd":
        opt = OptimizerKind.sgd(lr, momentum=momentum)
    elif optimizer == "adam":
        opt = OptimizerKind.adam(lr)
    else:
        opt = OptimizerKind.adamw(lr)
    kind = LossKind.MSE if loss == "mse" else LossKind.CROSS_ENTROPY
    return TrainerConfig(opt, kind, gradient_clip=clip, **more)


def checked_lr_and_momentum(
    optimizer: str, lr: float | None, momentum: float | None, loss: str, clip: float | None
) -> tuple[float, float]:
    """The learning rate and SGD momentum, defaults filled in, once the run's
    update rule takes them and `clip` (`update_rule`, its values usable in
    the models' float32), checked flag by flag: what the library takes, the
    command takes (`--momentum 1.5`, `--lr 0`, as torch.optim does).

    Raises:
        CliError: naming the flag, with the library's reason: `--lr` or
            `--momentum` negative, NaN, infinite in float32 or non-zero but
            0 there; `--clip` not positive and finite.
    """
    rate = default_lr(optimizer) if lr is None else lr
    factor = DEFAULT_MOMENTUM if momentum is None else momentum
    checks = (  # each flag with those before it: an error is that flag's
        ("--lr", rate, DEFAULT_MOMENTUM, None),
        ("--momentum", rate, factor, None),
        ("--clip", rate, factor, clip),
    )
    for flag, each_lr, each_momentum, each_clip in checks:
        try:
            config = update_rule(optimizer, each_lr, each_momentum, loss, each_clip)
            config.optimizer.check_dtype(_MODEL_DTYPE)
        except (TypeError, ValueError) as exc:
            raise CliError(f"{flag}: {exc}") from None
    return rate, factor
