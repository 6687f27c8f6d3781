"""`TrainerConfig`: what every trainer needs besides the model and devices."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from atomr._arguments import int_at_least, real_number
from atomr.actor.ref import check_timeout
from atomr.train.core.loss import LossKind
from atomr.train.core.optimizer import OptimizerKind
from atomr.train.core.schedule import LrSchedule

__all__ = ["TrainerConfig", "check_update_rule"]


def check_update_rule(optimizer: object, loss: object, gradient_clip: float | None) -> None:
    """Check the optimizer, loss and clipping every trainer's config carries.

    Args:
        optimizer: must be an `OptimizerKind`.
        loss: must be a `LossKind`.
        gradient_clip: None, or a positive finite global L2 norm.

    Raises:
        TypeError: `optimizer` or `loss` has the wrong type, or `gradient_clip`
            is not a real number (a string such as "1" included).
        ValueError: `gradient_clip` is not positive and finite (an int beyond
            float's range included).
    """
    if not isinstance(optimizer, OptimizerKind):
        raise TypeError(f"optimizer must be an OptimizerKind, got {optimizer!r}")
    if not isinstance(loss, LossKind):
        raise TypeError(f"loss must be a LossKind, got {loss!r}")
    if gradient_clip is None:
        return
    if not 0.0 < real_number("gradient_clip", gradient_clip) < float("inf"):
        raise ValueError(f"gradient_clip must be positive and finite, got {gradient_clip}")


@dataclass(frozen=True, slots=True)
class TrainerConfig:
    """Optimizer, loss, clipping and accumulation of a trainer.

    Attributes:
        optimizer: the update rule (`OptimizerKind.sgd(...)`, `.adam(...)`,
            `.adamw(...)`).
        loss: the loss (`LossKind.MSE`, `LossKind.CROSS_ENTROPY`,
            `LossKind.weighted_cross_entropy(...)`).
        gradient_clip: clip the gradient to this global L2 norm before the
            optimizer step (torch's `clip_grad_norm_`), or None for no clipping.
        accumulation_steps: K >= 1; K `Step` messages accumulate their
            gradients and the optimizer applies once, on the K-th, exactly as
            one step on the concatenated batch. A strategy that cannot
            accumulate refuses K > 1 when it is spawned.
        worker_timeout: seconds a trainer waits for any one reply of its
            workers (replicas, shards, stages, servers) before it fails the
            request; None waits forever, explicitly.
        max_steps: the most optimizer steps this trainer applies (entrenar's
            step limit; every strategy): a `Step` past it is refused with
            `StepLimitError`, `GetTrainingState` reports it, and `fit` stops
            there. None: no limit.
        schedule: a learning-rate schedule (`atomr.train.core.schedule`),
            stepped once per optimizer update by every trainer; it is folded
            into `optimizer` (`optimizer.schedule`), which every worker's
            optimizer and every checkpoint carries, so a resumed run goes on
            with the schedule exactly.

    Raises:
        TypeError: `optimizer` or `loss` has the wrong type,
            `worker_timeout` is not a number or None, `accumulation_steps`
            is not an int, `max_steps` not an int or None, or `schedule` is
            not an `LrSchedule` (NumPy's scalars are numbers: `_arguments`).
        ValueError: `gradient_clip` is not positive and finite (an int beyond
            float's range included).
            `accumulation_steps < 1`, `worker_timeout` is not positive
            and finite, `max_steps < 1`, or both
            `schedule` and `optimizer.schedule` are set.
    """

    optimizer: OptimizerKind
    loss: LossKind
    gradient_clip: float | None = None
    accumulation_steps: int = 1
    worker_timeout: float | None = 120.0
    schedule: LrSchedule | None = None
    max_steps: int | None = None

    def __post_init__(self) -> None:
        check_update_rule(self.optimizer, self.loss, self.gradient_clip)
        if self.schedule is not None:
            if self.optimizer.schedule not in (None, self.schedule):
                raise ValueError(
                    "schedule given twice (TrainerConfig.schedule and optimizer.schedule)"
                )
            object.__setattr__(self, "optimizer", self.optimizer.with_schedule(self.schedule))
        steps = int_at_least("accumulation_steps", self.accumulation_steps, 1)
        object.__setattr__(self, "accumulation_steps", steps)
        check_timeout(self.worker_timeout, "worker_timeout", finite=True)
        if self.max_steps is not None:
            object.__setattr__(self, "max_steps", int_at_least("max_steps", self.max_steps, 1))

    def check_dtype(self, dtype: Any) -> None:
        """Check what this config computes with in `dtype`, the model's: the
        optimizer's hyperparameters (`OptimizerKind.check_dtype`) and the
        loss's class weights (`LossKind.check_dtype`). Every trainer runs it
        before anything is spawned, so a float32 model refuses `lr=1e39` or
        a class weight of 1e39 that a float64 one takes.

        Raises:
            ValueError: a value out of range in `dtype`, naming it.
        """
        self.optimizer.check_dtype(dtype)
        self.loss.check_dtype(dtype)
