"""A gradient accumulation window: the one open in a trainer, and the one
saved in a checkpoint.

`AccumulationWindow` counts an open window's micro-steps and their totals
(the gradients themselves stay where the trainer keeps them: on its device,
or on its replicas). A checkpoint taken `micro` steps into a window of `accumulation_steps`
holds, in its `extra`, what the window's last step still needs: `micro`,
`accum_grads` (the sum of the micro-steps' gradient *sums*, undivided),
`accum_loss` and `accum_norm` (their loss sums and normalisers), and
`accum_samples` (their rows: the next micro-batch's first row in the
window's one batch, for per-sample randomness such as dropout). A trainer
that accumulates writes them with `accumulation_extra` and reads them back,
checked, with `read_pending` (the single-device and data-parallel trainers
share the format, so such a checkpoint moves between them).
`check_resumable_window` is the one rule every trainer's `LoadCheckpoint`
refuses a window by: one it cannot resume (its own `accumulation_steps`
or more; a trainer that does not accumulate has 1, so it resumes none).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from atomr._arguments import real_as_float
from atomr._repr import bounded_repr
from atomr.train.core.checkpoint import (
    Checkpoint,
    CheckpointError,
    extra_count,
    pending_micro_steps,
)
from atomr.train.core.validation import cast_finite

__all__ = [
    "AccumulationWindow",
    "PendingAccumulation",
    "accumulation_extra",
    "check_resumable_window",
    "read_pending",
]


@dataclass(frozen=True, eq=False)
class PendingAccumulation:
    """An open accumulation window.

    Attributes:
        micro: micro-steps taken (1 .. accumulation_steps - 1).
        grads: the sum of their gradient sums (host, the model's dtype).
        loss_sum: the sum of their loss sums.
        normaliser: the sum of their normalisers (>= 0).
        samples: the rows they took (checkpoints from before it was kept: 0).
    """

    micro: int
    grads: np.ndarray
    loss_sum: float
    normaliser: float
    samples: int = 0


@dataclass
class AccumulationWindow:
    """The micro-steps taken so far in the open accumulation window, and
    their totals.

    Attributes:
        micro: micro-steps taken (0: no window open).
        loss_sum: their loss sums' sum.
        normaliser: their normalisers' sum.
        samples: their rows (whole batches): the next micro-batch's first
            row in the window's one batch.
    """

    micro: int = 0
    loss_sum: float = 0.0
    normaliser: float = 0.0
    samples: int = 0

    def add(self, loss_sum: float, normaliser: float, samples: int) -> None:
        """Count one more micro-step that did not close the window."""
        self.micro += 1
        self.loss_sum += loss_sum
        self.normaliser += normaliser
        self.samples += samples

    def close(self, loss_sum: float, normaliser: float) -> tuple[float, float]:
        """The window's loss sum and normaliser with its last step's, and the
        window closed."""
        totals = (self.loss_sum + loss_sum, self.normaliser + normaliser)
        self.reset()
        return totals

    def reset(self) -> None:
        """Close the window (its gradients are dropped or were applied)."""
        self.micro, self.loss_sum, self.normaliser, self.samples = 0, 0.0, 0.0, 0

    def saved(self, grads: np.ndarray) -> PendingAccumulation | None:
        """The window as a checkpoint keeps it, with its gradient sums
        `grads`; None when no window is open."""
        if self.micro == 0:
            return None
        return PendingAccumulation(self.micro, grads, self.loss_sum, self.normaliser, self.samples)

    def reopen(self, pending: PendingAccumulation, totals: bool = True) -> None:
        """Open a saved window (`totals=False`: count its micro-steps and rows
        but not its loss sum and normaliser, which another process counts)."""
        self.reset()
        self.micro, self.samples = pending.micro, pending.samples
        if totals:
            self.loss_sum, self.normaliser = pending.loss_sum, pending.normaliser


def accumulation_extra(pending: PendingAccumulation | None) -> dict[str, Any]:
    """The checkpoint `extra` entries for `pending` (None: no window open)."""
    if pending is None:
        return {"micro": 0, "accum_loss": 0.0, "accum_norm": 0.0}
    return {
        "micro": pending.micro,
        "accum_grads": pending.grads,
        "accum_loss": pending.loss_sum,
        "accum_norm": pending.normaliser,
        "accum_samples": pending.samples,
    }


def check_resumable_window(ckpt: Checkpoint, accumulation_steps: int, trainer: str) -> int:
    """How many micro-steps into an accumulation window the checkpoint was
    saved (0: none open), checked to be a window `trainer` can resume: fewer
    micro-steps than its `accumulation_steps` (1 for a trainer that does not
    accumulate, which resumes none). It reads the checkpoint only, so a
    trainer that calls it before loading changes nothing when it raises.

    Args:
        ckpt: the checkpoint.
        accumulation_steps: the loading trainer's window (>= 1).
        trainer: the loading trainer's class name, for the message.

    Raises:
        CheckpointError: `extra["micro"]` is not a count, or is
            `accumulation_steps` or more.
    """
    micro = pending_micro_steps(ckpt)
    if micro >= accumulation_steps:
        steps = f"{micro} micro-step{'s' if micro != 1 else ''}"
        raise CheckpointError(
            f"checkpoint was saved {steps} into a gradient accumulation window; "
            f"{trainer} with accumulation_steps={accumulation_steps} cannot resume it"
        )
    return micro


def read_pending(
    ckpt: Checkpoint, n_params: int, accumulation_steps: int, dtype: Any, trainer: str
) -> PendingAccumulation | None:
    """The window a checkpoint was saved in, checked, or None.

    Args:
        ckpt: the checkpoint.
        n_params: the model's parameter count.
        accumulation_steps: the loading trainer's window.
        dtype: the model's dtype (the gradients must be finite in it).
        trainer: the loading trainer's class name, for the message.

    Raises:
        CheckpointError: a window the trainer cannot resume
            (`check_resumable_window`), or the gradients, loss or
            normaliser are missing, of another shape, not finite, or (the
            normaliser, the rows) negative.
    """
    micro = check_resumable_window(ckpt, accumulation_steps, trainer)
    if micro == 0:
        return None
    grads = ckpt.extra.get("accum_grads")
    if not isinstance(grads, np.ndarray) or grads.shape != (n_params,) or grads.dtype.kind != "f":
        shown = type(grads).__name__ if not isinstance(grads, np.ndarray) else grads.dtype
        raise CheckpointError(
            f"checkpoint's pending gradients are {shown} "
            f"{getattr(grads, 'shape', '')}, this model has {n_params} parameters"
        )
    cast = cast_finite(grads, dtype, "checkpoint's pending gradients", CheckpointError)
    loss_sum = _finite_number(ckpt.extra, "accum_loss")
    normaliser = _finite_number(ckpt.extra, "accum_norm")
    if normaliser < 0.0:
        raise CheckpointError(f"checkpoint's accum_norm is negative: {normaliser}")
    samples = extra_count(ckpt, "accum_samples")
    return PendingAccumulation(micro, cast, loss_sum, normaliser, samples)


def _finite_number(extra: dict[str, Any], key: str) -> float:
    """`extra[key]` as a float, checked to be a finite real number.

    Raises:
        CheckpointError: missing, not a number (a bool or string), or not finite.
    """
    value = extra.get(key)
    if isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "fiu":
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CheckpointError(f"checkpoint's {key} must be a number, got {bounded_repr(value)}")
    number = real_as_float(value)
    if not math.isfinite(number):
        raise CheckpointError(f"checkpoint's {key} is not finite: {bounded_repr(value)}")
    return number
