"""Per-step and evaluation statistics returned by every trainer."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EvalResult", "ShardStepResult", "StepStats", "TrainingState"]


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
        updates: when `applied`, the optimizer updates this `Step` made, as
            the trainer counts them (`TrainingState.step`): 1, or one per
            worker's part on an asynchronous parameter server, or one per
            batch of a local-SGD round.
    """

    loss: float
    grad_norm: float
    step_micros: int
    samples: int
    applied: bool = True
    comm_micros: int = 0
    updates: int = 1


@dataclass(frozen=True, slots=True)
class EvalResult:
    """The result of an `Evaluate`: loss and accuracy without updating weights.

    Attributes:
        loss: mean loss over the batch (the loss kind's reduction); NaN
            when every target has class weight 0 (`normaliser` 0, torch's 0/0).
        accuracy: fraction of samples whose arg-max output equals the label
            (cross-entropy losses); NaN for MSE, which has no class labels.
        samples: number of samples evaluated.
        normaliser: what the batch's loss sum was divided by to give `loss`
            (`LossKind`: the target values, the labels, or the sum of the
            targets' class weights); `fit` weights each batch's loss by it
            when it evaluates a set batch by batch. None when a trainer does
            not say (one of your own): `fit` then weights by the label count.
    """

    loss: float
    accuracy: float
    samples: int
    normaliser: float | None = None


ShardStepResult = StepStats
"""The seed crate's name for what one step returns: here every trainer's
`Step` answers a `StepStats` (loss, gradient norm, time, samples)."""


@dataclass(frozen=True, slots=True)
class TrainingState:
    """Where a trainer stands: the answer to `GetTrainingState`.

    Attributes:
        step: optimizer steps applied so far (a loaded checkpoint's included).
        max_steps: `TrainerConfig.max_steps` (None: no limit).
        is_coordinator: True for the process that coordinates the job (rank
            0 of a multi-process data-parallel job; a single process always).
        rounds: True when a `Step` answers before its batch is applied and
            a later `Step` (or `CloseRound`) answers with the figures of
            the whole round (data parallel under `ApplyPolicy.CADENCE` or
            `ASYNC`); such a trainer answers `CloseRound`.
    """

    step: int
    max_steps: int | None
    is_coordinator: bool = True
    rounds: bool = False

    @property
    def reached_max_steps(self) -> bool:
        """True once `step` has reached `max_steps`."""
        return self.max_steps is not None and self.step >= self.max_steps
