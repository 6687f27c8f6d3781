"""The pipeline's messages: what a `PipelineParallelTrainer` answers beyond
the common trainer messages (`GetGradients`, `GetTimeline`), and the stage
protocol, the messages trainer and stages exchange (`PipelineStageProtocol`
lists them with their replies).

For one step the trainer tells every stage its ops (`RunMicroBatches`, from
a `Schedule` plan); the stages then talk to each other directly: a forward
tells the successor its output (`Activations`), a backward tells the
predecessor the gradient of its input (`Gradients`). Each stage answers
`RunMicroBatches` with a `StageReport` once all of its ops are done. Only
then does the trainer decide: `ApplyStageGradients` to every stage,
`RollbackStep` if an apply failed somewhere, or `AbortStep` to drop a step
that failed anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from atomr.actor import ActorRef
from atomr.train.core.loss import LossKind
from atomr.train.core.messages import SetLearningRate
from atomr.train.core.optimizer import OptimizerKind
from atomr.train.pipeline.schedule import Op

__all__ = [
    "BusyInterval",
    "AbortStep",
    "Activations",
    "ApplyStageGradients",
    "ConnectStage",
    "GetGradients",
    "GetStageGradients",
    "GetStageState",
    "GetStageWeights",
    "GetTimeline",
    "Gradients",
    "PipelineStageProtocol",
    "RollbackStep",
    "RunMicroBatches",
    "SetStageState",
    "StageAborted",
    "StageInfo",
    "StageReport",
    "StageState",
]

# -- what the trainer answers besides the common trainer messages --------------


@dataclass(frozen=True, slots=True)
class BusyInterval:
    """One op a stage ran on its device.

    Attributes:
        stage: the stage index.
        kind: "F" (forward) or "B" (backward).
        micro: the micro-batch index.
        start: start, in seconds since the step began.
        end: end, in seconds since the step began.
    """

    stage: int
    kind: str
    micro: int
    start: float
    end: float

    @property
    def duration(self) -> float:
        """`end - start`, in seconds."""
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class GetGradients:
    """Ask a `PipelineParallelTrainer` for the full flat gradient of its last
    training step (the whole-batch mean, clipped if clipping applied), in the
    `Mlp.params` layout; answered with an ndarray."""


@dataclass(frozen=True, slots=True)
class GetTimeline:
    """Ask a `PipelineParallelTrainer` for the `Timeline` of its last step
    (None before the first step)."""


# -- the stage protocol ---------------------------------------------------------


@dataclass(frozen=True, eq=False)
class ConnectStage:
    """Trainer -> stage (ask), once before the first step: the stage's place
    in the pipeline and its optimizer. Answered with `StageInfo`. A stage
    told this again starts a fresh optimizer state.

    Attributes:
        index: this stage's index `s`, `0 <= s < n_stages`.
        n_stages: p.
        previous: stage `s - 1` (None for the first stage).
        next: stage `s + 1` (None for the last stage).
        optimizer: the update rule for this stage's parameters.
    """

    index: int
    n_stages: int
    previous: ActorRef | None
    next: ActorRef | None
    optimizer: OptimizerKind


@dataclass(frozen=True, slots=True)
class StageInfo:
    """What a stage holds; the answer to `ConnectStage`.

    Attributes:
        model: its sub-model's config (`Sequential.config()`; an `Mlp`
            slice's has `sizes`).
        n_params: its number of parameters.
        dtype: its parameters' dtype name ("float32").
        in_shape: what it takes, per sample.
        out_shape: what it gives, per sample.
    """

    model: dict[str, Any]
    n_params: int
    dtype: str
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]


@dataclass(frozen=True, eq=False)
class RunMicroBatches:
    """Trainer -> stage (ask): run one step's ops. Answered with a
    `StageReport` once every op in `ops` has run, or with the exception that
    stopped it (the step is then dead on this stage: nothing applied,
    activations dropped).

    Attributes:
        step_id: increases with every step of the trainer.
        ops: this stage's ops in order (`Schedule.stage_ops`).
        train: True for a training step (keep activations, run backwards),
            False for an evaluation (`ops` holds forwards only).
        loss: the loss kind (used by the last stage).
        normaliser: the whole batch's loss normaliser; the last stage's
            output gradient is `d(loss_sum)/d(outputs) / normaliser`, so the
            accumulated gradients are those of the whole-batch mean.
        inputs: first stage only: the features of every micro-batch.
        targets: last stage only: the labels / targets of every micro-batch.
        step: the optimizer steps applied so far (dropout masks depend on it).
        micro_offsets: each micro-batch's first row in the whole batch.
    """

    step_id: int
    ops: tuple[Op, ...]
    train: bool
    loss: LossKind
    normaliser: float
    inputs: tuple[np.ndarray, ...] | None = None
    targets: tuple[np.ndarray, ...] | None = None
    step: int = 0
    micro_offsets: tuple[int, ...] = ()


@dataclass(frozen=True, eq=False)
class Activations:
    """Stage s -> stage s + 1 (tell): the output of stage s's forward of one
    micro-batch, the input of stage s + 1's forward.

    Attributes:
        step_id: the step.
        micro: the micro-batch index.
        data: host array `(micro_batch, width)`.
    """

    step_id: int
    micro: int
    data: np.ndarray


@dataclass(frozen=True, eq=False)
class Gradients:
    """Stage s -> stage s - 1 (tell): dLoss/d(input of stage s) for one
    micro-batch, the output gradient of stage s - 1's backward.

    Attributes:
        step_id: the step.
        micro: the micro-batch index.
        data: host array `(micro_batch, width)`.
    """

    step_id: int
    micro: int
    data: np.ndarray


@dataclass(frozen=True, slots=True)
class StageReport:
    """A stage's answer to `RunMicroBatches`.

    Attributes:
        step_id: the step.
        loss_sum: sum of the loss over its micro-batches (last stage; else 0).
        correct: number of samples whose arg-max output equals the label
            (last stage, classification; else 0).
        grad_sq_norm: squared L2 norm of its accumulated gradient (training).
        intervals: when it ran each op (absolute `time.perf_counter` seconds,
            `stage` set to its index).
        peak_held: the most micro-batches' activations it held at once.
    """

    step_id: int
    loss_sum: float
    correct: int
    grad_sq_norm: float
    intervals: tuple[BusyInterval, ...]
    peak_held: int


@dataclass(frozen=True, slots=True)
class AbortStep:
    """Trainer -> stage (ask): drop step `step_id` (its activations, its
    gradients, its pending ops); answered with None. A still-pending
    `RunMicroBatches` of that step fails with `StageAborted`.

    Attributes:
        step_id: the step to drop.
    """

    step_id: int


@dataclass(frozen=True, slots=True)
class ApplyStageGradients:
    """Trainer -> stage (ask): multiply the accumulated gradient by `coef`
    (global-norm clipping; 1.0 for none) and take one optimizer step, keeping
    the old weights and optimizer state for `RollbackStep`. Answered with None.

    Attributes:
        step_id: the step whose gradient to apply.
        coef: gradient scale factor.
    """

    step_id: int
    coef: float


@dataclass(frozen=True, slots=True)
class RollbackStep:
    """Trainer -> stage (ask): undo the `ApplyStageGradients` of `step_id` (swap
    the old state back); a no-op when that step was not applied. Answered with None.

    Attributes:
        step_id: the step to undo.
    """

    step_id: int


@dataclass(frozen=True, slots=True)
class GetStageWeights:
    """Trainer -> stage (ask): a host copy of the stage's flat parameters."""


@dataclass(frozen=True, slots=True)
class GetStageGradients:
    """Trainer -> stage (ask): a host copy of the stage's gradient of the last
    training step (the whole-batch mean, after clipping if it was applied)."""


@dataclass(frozen=True, eq=False)
class StageState:
    """A stage's weights and optimizer state (checkpoints).

    Attributes:
        weights: flat host parameters.
        optimizer: the optimizer's `state_dict()` (buffers sliced to the stage).
    """

    weights: np.ndarray
    optimizer: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class GetStageState:
    """Trainer -> stage (ask): answered with the stage's `StageState`."""


@dataclass(frozen=True, eq=False)
class SetStageState:
    """Trainer -> stage (ask): replace weights and optimizer state; answered
    with None, or a `CheckpointError` failure that changes nothing.

    Attributes:
        state: the new state.
    """

    state: StageState


class StageAborted(RuntimeError):
    """A stage's `RunMicroBatches` was dropped by `AbortStep` (another stage
    failed first)."""


class PipelineStageProtocol:
    """The messages a pipeline stage actor answers (bring your own stage).

    | message | from -> to | reply |
    |---|---|---|
    | `ConnectStage(index, n_stages, previous, next, optimizer)` | trainer -> stage, ask | `StageInfo` |
    | `RunMicroBatches(step_id, ops, train, loss, normaliser, inputs, targets)` | trainer -> stage, ask | `StageReport` when all ops ran |
    | `Activations(step_id, micro, data)` | stage s -> s + 1, tell | none |
    | `Gradients(step_id, micro, data)` | stage s -> s - 1, tell | none |
    | `AbortStep(step_id)` | trainer -> stage, ask | None |
    | `ApplyStageGradients(step_id, coef)` | trainer -> stage, ask | None |
    | `RollbackStep(step_id)` | trainer -> stage, ask | None |
    | `GetStageWeights()` / `GetStageGradients()` | trainer -> stage, ask | ndarray |
    | `GetStageState()` / `SetStageState(state)` | trainer -> stage, ask | `StageState` / None |
    | `SetLearningRate(lr)` | trainer -> stage, ask | `float`: the rate it replaces (given back if another worker fails) |

    Rules a stage keeps: it runs the ops of `RunMicroBatches` in order, each
    once its input is there (`inputs[k]` or an `Activations` for F; the
    successor's `Gradients`, or its own loss gradient on the last stage, for
    B); `Activations`/`Gradients` may arrive before their `RunMicroBatches`
    and must be buffered; messages of a finished or aborted step are
    dropped. It never changes its weights before `ApplyStageGradients`. Bad
    requests are answered with a failure, without failing the actor.

    The built-in stage is `StageActor`.

    Attributes:
        messages: the message types above.
    """

    messages: ClassVar[tuple[type, ...]] = (
        ConnectStage,
        RunMicroBatches,
        Activations,
        Gradients,
        AbortStep,
        ApplyStageGradients,
        RollbackStep,
        GetStageWeights,
        GetStageGradients,
        GetStageState,
        SetStageState,
        SetLearningRate,
    )
