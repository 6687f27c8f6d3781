"""Per-step and evaluation statistics returned by every trainer."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EvalResult", "StepStats"]


@dataclass(frozen=True, slots=True)
class StepStats:
    """What one `Step` did.

    Attributes:
        loss: mean loss of the batch (for an accumulating micro-step, the mean
            loss of that micro-batch; on the applying step, the mean loss of
            the whole accumulated batch).
        grad_norm: global L2 norm of the gradient *before* clipping (0.0 on a
            micro-step that only accumulated).
        step_micros: wall time of the step on its device, in microseconds.
        samples: number of samples in this message's batch.
        applied: True when the optimizer updated the weights on this step
            (always True without gradient accumulation).
        comm_micros: of `step_micros`, the time spent reducing gradients
            across workers (the data-parallel all-reduce); 0 where a strategy
            has no such phase.
    """

    loss: float
    grad_norm: float
    step_micros: int
    samples: int
    applied: bool = True
    comm_micros: int = 0


@dataclass(frozen=True, slots=True)
class EvalResult:
    """The result of an `Evaluate`: loss and accuracy without updating weights.

    Attributes:
        loss: mean loss over the batch (the loss kind's reduction).
        accuracy: fraction of samples whose arg-max output equals the label
            (cross-entropy losses); NaN for MSE, which has no class labels.
        samples: number of samples evaluated.
    """

    loss: float
    accuracy: float
    samples: int
