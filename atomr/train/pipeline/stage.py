"""Pipeline stages: the `PipelineStageProtocol` messages and `StageActor`,
the built-in stage that holds consecutive layers of an `Mlp` on one device.

A stage owns a contiguous slice of the model. For one step the trainer tells
every stage its ops (`RunMicroBatches`, from a `Schedule` plan); the stages
then talk to each other directly: a forward tells the successor its output
(`Activations`), a backward tells the predecessor the gradient of its input
(`Gradients`). Each stage runs its ops strictly in plan order, each as soon
as its input has arrived, accumulating its parameter gradients over the
micro-batches without touching its weights, and answers `RunMicroBatches`
with a `StageReport` once all of its ops are done. Only then does the trainer
decide: `ApplyGradients` to every stage (scale for clipping, optimizer
step, the old state kept), `RollbackStep` if an apply failed somewhere, or
`AbortStep` to drop a step that failed anywhere.

Users may bring their own stage actor: anything that answers the messages of
`PipelineStageProtocol` (see its docstring) can be given to
`PipelineParallelTrainer.props(config, stages)`. The simplest way is to
subclass `StageActor` and override its device-side hooks
(`forward_micro`, `backward_micro`, ...).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from atomr.accel import Device, DeviceActor
from atomr.actor import ActorRef, Failure, Props, Reply
from atomr.train._recovery import DoubleBuffer
from atomr.train.core.errors import CheckpointError
from atomr.train.core.loss import LossKind
from atomr.train.core.mlp import Mlp, Tape
from atomr.train.core.optimizer import Optimizer, OptimizerKind
from atomr.train.pipeline.schedule import Op, OpKind
from atomr.train.pipeline.timeline import BusyInterval

__all__ = [
    "AbortStep",
    "Activations",
    "ApplyGradients",
    "ConnectStage",
    "GetStageGradients",
    "GetStageState",
    "GetStageWeights",
    "Gradients",
    "PipelineStageProtocol",
    "RollbackStep",
    "RunMicroBatches",
    "SetStageState",
    "StageActor",
    "StageAborted",
    "StageInfo",
    "StageReport",
    "StageState",
    "balanced_split",
]


# ----------------------------------------------------------------- messages


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
        sizes: its layer widths, input first (the Mlp slice's `sizes`).
        activation: the model's activation name.
        n_params: its number of parameters.
        dtype: its parameters' dtype name ("float32").
    """

    sizes: tuple[int, ...]
    activation: str
    n_params: int
    dtype: str


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
    """

    step_id: int
    ops: tuple[Op, ...]
    train: bool
    loss: LossKind
    normaliser: float
    inputs: tuple[np.ndarray, ...] | None = None
    targets: tuple[np.ndarray, ...] | None = None


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
class ApplyGradients:
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
    """Trainer -> stage (ask): undo the `ApplyGradients` of `step_id` (swap
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
    | `ApplyGradients(step_id, coef)` | trainer -> stage, ask | None |
    | `RollbackStep(step_id)` | trainer -> stage, ask | None |
    | `GetStageWeights()` / `GetStageGradients()` | trainer -> stage, ask | ndarray |
    | `GetStageState()` / `SetStageState(state)` | trainer -> stage, ask | `StageState` / None |

    Rules a stage keeps: it runs the ops of `RunMicroBatches` in order, each
    once its input is there (`inputs[k]` or an `Activations` for F; the
    successor's `Gradients`, or its own loss gradient on the last stage, for
    B); `Activations`/`Gradients` may arrive before their `RunMicroBatches`
    and must be buffered; messages of a finished or aborted step are
    dropped. It never changes its weights before `ApplyGradients`. Bad
    requests are answered with a failure, without failing the actor.

    Attributes:
        messages: the message types above.
    """

    messages: ClassVar[tuple[type, ...]] = (
        ConnectStage,
        RunMicroBatches,
        Activations,
        Gradients,
        AbortStep,
        ApplyGradients,
        RollbackStep,
        GetStageWeights,
        GetStageGradients,
        GetStageState,
        SetStageState,
    )


# ----------------------------------------------------------------- splitting


def balanced_split(layer_params: Sequence[int], n_stages: int) -> list[int]:
    """Cut consecutive layers into stages with the smallest largest stage.

    Args:
        layer_params: the parameter count of each layer, in order.
        n_stages: number of stages, `1 <= n_stages <= len(layer_params)`.

    Returns:
        The number of layers of each stage (each >= 1, summing to the layer
        count); among the splits minimising the largest stage's parameter
        count, the one whose stages are filled front first.

    Raises:
        ValueError: `n_stages` below 1 or above the number of layers.
    """
    n = len(layer_params)
    if isinstance(n_stages, bool) or not isinstance(n_stages, int) or n_stages < 1:
        raise ValueError(f"the number of stages must be an int >= 1, got {n_stages!r}")
    if n_stages > n:
        raise ValueError(
            f"{n_stages} stages for a model of {n} layers: every stage needs at least one "
            "layer; use at most as many devices as layers"
        )
    prefix = [0]
    for c in layer_params:
        prefix.append(prefix[-1] + int(c))
    inf = float("inf")
    # best[k][i]: smallest max stage cost of the first i layers in k stages
    best = [[inf] * (n + 1) for _ in range(n_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(n_stages + 1)]
    best[0][0] = 0
    for k in range(1, n_stages + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                cost = max(best[k - 1][j], prefix[i] - prefix[j])
                if cost < best[k][i]:
                    best[k][i], cut[k][i] = cost, j
    counts = []
    i = n
    for k in range(n_stages, 0, -1):
        j = cut[k][i]
        counts.append(i - j)
        i = j
    return counts[::-1]


# ----------------------------------------------------------------- the actor


@dataclass
class _Run:
    """The state of one step on a stage (event-loop side)."""

    step_id: int
    ops: tuple[Op, ...]
    train: bool
    loss: LossKind
    normaliser: float
    reply: Reply
    targets: tuple[np.ndarray, ...] | None
    inputs: dict[int, np.ndarray] = field(default_factory=dict)
    grads: dict[int, np.ndarray] = field(default_factory=dict)
    pos: int = 0
    backwards: int = 0
    loss_sum: float = 0.0
    correct: int = 0
    intervals: list[BusyInterval] = field(default_factory=list)
    peak_held: int = 0


def _timed(fn: Callable[..., Any], *args: Any) -> tuple[Any, float, float]:
    """Run `fn(*args)` and return its result with its start and end times."""
    start = time.perf_counter()
    with np.errstate(over="ignore", invalid="ignore"):
        result = fn(*args)
    return result, start, time.perf_counter()


class StageActor(DeviceActor):
    """A pipeline stage holding consecutive layers of an `Mlp` on one device.

    Speaks `PipelineStageProtocol`. Its math runs on the device's worker
    thread (`on_device`), in the hooks below, which subclasses may override
    (a user stage with another kind of layer, an instrumented stage, ...):
    `forward_micro`, `backward_micro`, `held_activations`,
    `drop_activations`, `gradient_sq_norm`, `apply_gradients`, `rollback`.

    Args:
        model: the stage's sub-model (e.g. `Mlp.slice_layers(a, b)`); copied
            onto `device` when the actor starts (the given object is not
            modified).
        device: the device (a `Device` or its name).

    Raises:
        TypeError: `model` is not an `Mlp`.
        ValueError: bad device name.
    """

    def __init__(self, model: Mlp, device: Device | str) -> None:
        super().__init__(device)
        if not isinstance(model, Mlp):
            raise TypeError(f"model must be an Mlp, got {type(model).__name__}")
        self._template = model
        self.model: Mlp | None = None
        self.optimizer: Optimizer | None = None
        self.index = 0
        self.n_stages = 1
        self.previous: ActorRef | None = None
        self.next: ActorRef | None = None
        self._tapes: dict[int, tuple[Tape, Any]] = {}
        self._run: _Run | None = None
        self._closed = 0  # every step_id <= this is finished or aborted
        self._early: dict[int, list[Activations | Gradients]] = {}
        self._undo = DoubleBuffer()  # the old state of the last apply, for rollback
        self._undo_step: int | None = None
        self._loss_kind: LossKind = LossKind.MSE

    @classmethod
    def props(cls, model: Mlp, device: Device | str) -> Props:
        """The `Props` of a stage (see the class docstring for the arguments)."""
        return Props(cls, model, device)

    @property
    def is_first(self) -> bool:
        """True for stage 0."""
        return self.index == 0

    @property
    def is_last(self) -> bool:
        """True for stage p - 1 (it computes the loss)."""
        return self.index == self.n_stages - 1

    # -- device-side hooks (run on the worker thread) -----------------------

    def _build(self) -> None:
        self.model = self._template.to(self.device)

    def forward_micro(
        self,
        micro: int,
        x: np.ndarray,
        target: np.ndarray | None,
        normaliser: float,
        train: bool,
    ) -> tuple[np.ndarray | None, float, int]:
        """Forward of one micro-batch (worker thread).

        Args:
            micro: the micro-batch index.
            x: host input `(micro_batch, in_width)`.
            target: its labels / targets on the last stage, else None.
            normaliser: the whole batch's loss normaliser (last stage).
            train: keep what the backward needs (and, on the last stage, the
                loss gradient `d(loss_sum)/d(outputs) / normaliser`).

        Returns:
            `(output, loss_sum, correct)`: the host output to send on (None
            on the last stage), and on the last stage the micro-batch's loss
            sum and number of correctly classified samples.
        """
        model = self.model
        assert model is not None
        be = model.backend
        xd = be.to_device(np.ascontiguousarray(x, dtype=model.dtype))
        tape = model.forward_train(xd) if train else None
        out = tape.output if tape is not None else model.forward(xd)
        if target is None:
            if tape is not None:
                self._tapes[micro] = (tape, None)
            return np.asarray(be.to_host(out)), 0.0, 0
        loss = self._loss_kind
        d_out = be.empty(out.shape, dtype=model.dtype)
        loss_sum, _ = loss.sums(be, out, be.to_device(target), d_out)
        correct = 0
        if loss.is_classification:
            correct = int(np.sum(np.argmax(be.to_host(out), axis=1) == target))
        if tape is not None:
            be.scale(d_out, 1.0 / normaliser)
            self._tapes[micro] = (tape, d_out)
        return None, float(loss_sum), correct

    def backward_micro(
        self, micro: int, dy: np.ndarray | None, accumulate: bool
    ) -> np.ndarray | None:
        """Backward of one micro-batch (worker thread); drops its activations.

        Args:
            micro: the micro-batch index (its forward has run).
            dy: host gradient of this stage's output (None on the last stage,
                which uses its own loss gradient).
            accumulate: add into the gradient (False on the step's first
                backward, which overwrites it).

        Returns:
            The host gradient of this stage's input (None on the first stage).
        """
        model = self.model
        assert model is not None
        be = model.backend
        tape, d_out = self._tapes.pop(micro)
        if dy is not None:
            d_out = be.to_device(np.ascontiguousarray(dy, dtype=model.dtype))
        dx = model.backward(tape, d_out, accumulate=accumulate, input_grad=not self.is_first)
        return None if dx is None else np.asarray(be.to_host(dx))

    def held_activations(self) -> int:
        """How many micro-batches' activations the stage holds now."""
        return len(self._tapes)

    def drop_activations(self) -> None:
        """Forget every held activation (an aborted step)."""
        self._tapes.clear()

    def gradient_sq_norm(self) -> float:
        """Squared L2 norm of the accumulated gradient (worker thread)."""
        model = self.model
        assert model is not None
        return float(model.backend.squared_norm(model.grads))

    def apply_gradients(self, step_id: int, coef: float) -> None:
        """Scale the gradient by `coef`, optimizer step (worker thread).

        The step is written out of place and swapped in; the old weights and
        optimizer buffers (`recovery.DoubleBuffer`, no copy) are kept until
        `rollback(step_id)` or the next apply. A failure changes no weights.
        """
        model, opt = self.model, self.optimizer
        assert model is not None and opt is not None
        self._undo.commit()
        self._undo_step = None
        if coef != 1.0:
            model.backend.scale(model.grads, coef)
        self._undo.apply(model.backend, model, "params", opt, model.grads)
        self._undo_step = step_id

    def rollback(self, step_id: int) -> None:
        """Undo `apply_gradients(step_id)`: swap the old state back (worker thread)."""
        model, opt = self.model, self.optimizer
        assert model is not None and opt is not None
        if self._undo_step != step_id or not self._undo.pending:
            return
        self._undo.rollback()
        self._undo_step = None

    def _connect(self, optimizer: OptimizerKind) -> StageInfo:
        model = self.model
        assert model is not None
        self.optimizer = optimizer.create(model.n_params, model.backend, model.dtype)
        self._undo.commit()
        self._undo_step = None
        return StageInfo(model.sizes, model.activation, model.n_params, model.dtype.name)

    def _get_state(self) -> StageState:
        model, opt = self.model, self.optimizer
        assert model is not None and opt is not None
        return StageState(model.get_params(), opt.state_dict())

    def _set_state(self, state: StageState) -> None:
        model, opt = self.model, self.optimizer
        assert model is not None and opt is not None
        weights = np.asarray(state.weights).reshape(-1)
        if weights.shape[0] != model.n_params:
            raise CheckpointError(
                f"stage {self.index} has {model.n_params} parameters, got {weights.shape[0]}"
            )
        fresh = opt.kind.create(model.n_params, model.backend, model.dtype)
        try:
            fresh.load_state_dict(state.optimizer)
        except (KeyError, ValueError, TypeError) as exc:
            raise CheckpointError(
                f"stage {self.index}: optimizer state does not fit: {exc}"
            ) from exc
        model.set_params(weights)
        self.optimizer = fresh
        self._undo.commit()
        self._undo_step = None

    # -- messages -----------------------------------------------------------

    async def receive(self, message: Any) -> Any:
        """Answer the `PipelineStageProtocol` messages (see its docstring)."""
        if self.model is None:
            await self.on_device(self._build)
        model = self.model
        assert model is not None
        if isinstance(message, Activations | Gradients):
            self._arrived(message)
            await self._pump()
            return None
        if isinstance(message, RunMicroBatches):
            return await self._start(message)
        if isinstance(message, AbortStep):
            self._abort(message.step_id)
            return None
        if isinstance(message, ConnectStage):
            if not 0 <= message.index < message.n_stages:
                return Failure(ValueError(f"bad stage index {message.index} of {message.n_stages}"))
            self.index, self.n_stages = message.index, message.n_stages
            self.previous, self.next = message.previous, message.next
            return await self.on_device(self._connect, message.optimizer)
        if self.optimizer is None:
            return Failure(RuntimeError(f"stage {self.path_name}: not connected (ConnectStage)"))
        if isinstance(message, ApplyGradients):
            try:
                await self.on_device(self.apply_gradients, message.step_id, float(message.coef))
            except Exception as exc:  # the trainer rolls every stage back (RollbackStep)
                return Failure(exc)
            return None
        if isinstance(message, RollbackStep):
            await self.on_device(self.rollback, message.step_id)
            return None
        if isinstance(message, GetStageWeights):
            return await self.on_device(model.get_params)
        if isinstance(message, GetStageGradients):
            return await self.on_device(lambda: np.asarray(model.backend.to_host(model.grads)))
        if isinstance(message, GetStageState):
            return await self.on_device(self._get_state)
        if isinstance(message, SetStageState):
            try:
                return await self.on_device(self._set_state, message.state)
            except CheckpointError as exc:
                return Failure(exc)
        return Failure(TypeError(f"{type(self).__name__} does not handle {type(message).__name__}"))

    @property
    def path_name(self) -> str:
        """This actor's path (for messages)."""
        return self.context.self_ref.path

    def _arrived(self, message: Activations | Gradients) -> None:
        if message.step_id <= self._closed:
            return  # a finished or aborted step: drop
        run = self._run
        if run is None or run.step_id != message.step_id:
            self._early.setdefault(message.step_id, []).append(message)
            return
        box = run.inputs if isinstance(message, Activations) else run.grads
        box[message.micro] = message.data

    async def _start(self, msg: RunMicroBatches) -> Any:
        if self.optimizer is None:
            return Failure(RuntimeError("stage not connected: send ConnectStage first"))
        if self._run is not None or msg.step_id <= self._closed:
            return Failure(
                ValueError(f"stage {self.index}: step {msg.step_id} overlaps another step")
            )
        if self.is_first and msg.inputs is None:
            return Failure(ValueError("the first stage needs the micro-batch inputs"))
        if self.is_last and msg.targets is None:
            return Failure(ValueError("the last stage needs the micro-batch targets"))
        reply = self.context.defer()
        self._loss_kind = msg.loss
        run = _Run(
            msg.step_id,
            tuple(msg.ops),
            msg.train,
            msg.loss,
            float(msg.normaliser),
            reply,
            msg.targets,
        )
        if msg.inputs is not None and self.is_first:
            run.inputs.update(enumerate(msg.inputs))
        self._run = run
        for early in self._early.pop(msg.step_id, []):
            self._arrived(early)
        await self._pump()
        return None

    def _finish(self, run: _Run, error: BaseException | None, report: StageReport | None) -> None:
        self._run = None
        self._closed = max(self._closed, run.step_id)
        for sid in [s for s in self._early if s <= self._closed]:
            del self._early[sid]
        if error is not None:
            self.drop_activations()
            run.reply.set_exception(error)
        else:
            run.reply.set_result(report)

    def _abort(self, step_id: int) -> None:
        run = self._run
        if run is not None and run.step_id == step_id:
            self._finish(run, StageAborted(f"stage {self.index}: step {step_id} aborted"), None)
        else:
            self._closed = max(self._closed, step_id)
            self._early.pop(step_id, None)

    async def _pump(self) -> None:
        """Run the current step's next ops while their inputs are there."""
        run = self._run
        while run is not None and self._run is run and run.pos < len(run.ops):
            op = run.ops[run.pos]
            k = op.micro
            try:
                if op.kind is OpKind.FORWARD:
                    if k not in run.inputs:
                        return
                    x = run.inputs.pop(k)
                    target = run.targets[k] if self.is_last and run.targets is not None else None
                    (out, loss_sum, correct), t0, t1 = await self.on_device(
                        _timed, self.forward_micro, k, x, target, run.normaliser, run.train
                    )
                    run.loss_sum += loss_sum
                    run.correct += correct
                    if out is not None and self.next is not None:
                        self.next.tell(Activations(run.step_id, k, out))
                else:
                    if not run.train:
                        raise ValueError("an evaluation run has no backward ops")
                    dy = None
                    if not self.is_last:
                        if k not in run.grads:
                            return
                        dy = run.grads.pop(k)
                    accumulate = run.backwards > 0
                    dx, t0, t1 = await self.on_device(
                        _timed, self.backward_micro, k, dy, accumulate
                    )
                    run.backwards += 1
                    if dx is not None and self.previous is not None:
                        self.previous.tell(Gradients(run.step_id, k, dx))
            except Exception as exc:  # the stage's own failure: report it, keep the actor
                if self._run is run:
                    self._finish(run, exc, None)
                return
            if self._run is not run:
                return  # aborted meanwhile
            run.peak_held = max(
                run.peak_held, self.held_activations() + (op.kind is OpKind.BACKWARD)
            )
            run.intervals.append(BusyInterval(self.index, op.kind.value, k, t0, t1))
            run.pos += 1
        if run is None or self._run is not run:
            return
        grad_sq = 0.0
        if run.train:
            try:
                grad_sq = await self.on_device(self.gradient_sq_norm)
            except Exception as exc:
                self._finish(run, exc, None)
                return
            if not math.isfinite(grad_sq):
                grad_sq = float("inf")
        report = StageReport(
            run.step_id, run.loss_sum, run.correct, grad_sq, tuple(run.intervals), run.peak_held
        )
        self._finish(run, None, report)
