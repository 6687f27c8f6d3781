"""`StageActor`: the built-in pipeline stage, consecutive layers of a model
on one device, answering `PipelineStageProtocol`
(`atomr.train.pipeline.messages`).

A stage owns a contiguous slice of the model. It runs the ops of a step
strictly in plan order, each as soon as its input has arrived
(`StageRunner`), accumulating its parameter gradients over the
micro-batches without touching its weights; only `ApplyStageGradients`
changes them (scale for clipping, optimizer step out of place, the old
state kept for `RollbackStep`).

Users may bring their own stage actor: anything that answers the messages of
`PipelineStageProtocol` can be given to `PipelineParallelTrainer.props`. The
simplest way is to subclass `StageActor` and override its device-side hooks
(`forward_micro`, `backward_micro`, ...).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from atomr.accel import Device, DeviceActor
from atomr.actor import ActorRef, Failure, Props, not_handled
from atomr.train._recovery import DoubleBuffer
from atomr.train.core.checkpoint import restored_optimizer
from atomr.train.core.device_guard import Rejected, guarded
from atomr.train.core.errors import CheckpointError
from atomr.train.core.loss import LossKind
from atomr.train.core.messages import SetLearningRate
from atomr.train.core.model.layer import ForwardContext
from atomr.train.core.model.sequential import Sequential
from atomr.train.core.model.sequential import SequentialTape as Tape
from atomr.train.core.optimizer import OptimizerKind
from atomr.train.core.optimizer_state import Optimizer
from atomr.train.pipeline._stage_run import StageRunner
from atomr.train.pipeline.messages import (
    AbortStep,
    Activations,
    ApplyStageGradients,
    ConnectStage,
    GetStageGradients,
    GetStageState,
    GetStageWeights,
    Gradients,
    RollbackStep,
    RunMicroBatches,
    SetStageState,
    StageInfo,
    StageState,
)

__all__ = ["StageActor"]


class StageActor(DeviceActor):
    """A pipeline stage holding consecutive layers of a model on one device.

    Speaks `PipelineStageProtocol`. Its math runs on the device's worker
    thread (`on_device`), in the hooks below, which subclasses may override
    (a user stage with another kind of layer, an instrumented stage, a
    fault-injected one: `atomr.testkit.inject_faults`):
    `forward_micro`, `backward_micro`, `held_activations`,
    `drop_activations`, `gradient_sq_norm`, `apply_gradients`, `rollback`.

    Args:
        model: the stage's sub-model (`model.slice_layers(a, b)`); copied
            onto `device` when the actor starts (the given object is not
            modified).
        device: the device (a `Device` or its name).

    Raises:
        TypeError: `model` is not a `Sequential`.
        ValueError: bad device name.
    """

    def __init__(self, model: Sequential, device: Device | str) -> None:
        super().__init__(device)
        if not isinstance(model, Sequential):
            raise TypeError(f"model must be a Sequential, got {type(model).__name__}")
        self._template = model
        self.model: Sequential | None = None
        self.optimizer: Optimizer | None = None
        self.index = 0
        self.n_stages = 1
        self.previous: ActorRef | None = None
        self.next: ActorRef | None = None
        self._tapes: dict[int, tuple[Tape, Any]] = {}
        self._runner = StageRunner(self)
        self._undo = DoubleBuffer()  # the old state of the last apply, for rollback
        self._undo_step: int | None = None
        self._loss_kind: LossKind = LossKind.MSE
        # the optimizer step and micro-batch offsets of the running pass (dropout)
        self._pass_step = 0
        self._pass_offsets: dict[int, int] = {}

    @classmethod
    def props(cls, model: Sequential, device: Device | str) -> Props:
        """The `Props` of a stage (see the class docstring for the arguments)."""
        return Props(cls, model, device)

    @property
    def worker_index(self) -> int:
        """This stage's index (0 until `ConnectStage`): the `worker_index`
        its trainer puts on the errors it fails a request with."""
        return self.index

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
        dtype = np.int64 if model.input_kind == "tokens" else model.dtype
        xd = be.to_device(np.ascontiguousarray(x, dtype=dtype))
        ctx = ForwardContext(train, self._pass_step, self._pass_offsets.get(micro, 0))
        tape = model.forward_train(xd, ctx) if train else None
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
            correct = int(np.sum(np.argmax(be.to_host(out), axis=-1) == target))
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
        return StageInfo(
            model.config(), model.n_params, model.dtype.name, model.in_shape, model.out_shape
        )

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
        fresh = restored_optimizer(
            opt.kind,
            model.n_params,
            state.optimizer,
            model.backend,
            model.dtype,
            f"stage {self.index}",
        )
        model.set_params(weights)
        self.optimizer = fresh
        self._undo.commit()
        self._undo_step = None

    # -- messages -----------------------------------------------------------

    async def receive(self, message: Any) -> Any:
        """Answer the `PipelineStageProtocol` messages (see its docstring).

        Returns:
            The message's reply (a `RunMicroBatches` is answered later, once
            its ops ran), or a `Failure` for a bad or unknown request.
        """
        if self.model is None:
            await self.on_device(self._build)
        if isinstance(message, Activations | Gradients):
            self._runner.arrived(message)
            await self._runner.pump()
            return None
        if isinstance(message, RunMicroBatches):
            if self.optimizer is None:
                return Failure(RuntimeError("stage not connected: send ConnectStage first"))
            self._loss_kind = message.loss
            self._pass_step = message.step
            self._pass_offsets = dict(enumerate(message.micro_offsets))
            return await self._runner.start(message)
        if isinstance(message, AbortStep):
            self._runner.abort(message.step_id)
            return None
        if isinstance(message, ConnectStage):
            if not 0 <= message.index < message.n_stages:
                return Failure(ValueError(f"bad stage index {message.index} of {message.n_stages}"))
            self.index, self.n_stages = message.index, message.n_stages
            self.previous, self.next = message.previous, message.next
            return await self.on_device(self._connect, message.optimizer)
        if self.optimizer is None:
            return Failure(RuntimeError(f"stage {self.path_name}: not connected (ConnectStage)"))
        return await self._serve_state(message)

    async def _serve_state(self, message: Any) -> Any:
        """The messages about the stage's weights and optimizer state."""
        model = self.model
        assert model is not None
        if isinstance(message, SetLearningRate):
            assert self.optimizer is not None
            return await self.on_device(self.optimizer.set_lr, message.lr)
        if isinstance(message, ApplyStageGradients):
            try:  # a refused update (NonFiniteError) comes back as itself
                result = await self.on_device(
                    guarded, self.apply_gradients, message.step_id, float(message.coef)
                )
            except Exception as exc:  # the trainer rolls every stage back (RollbackStep)
                return Failure(exc)
            return Failure(result.error) if isinstance(result, Rejected) else None
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
        return not_handled(type(self).__name__, message)

    @property
    def path_name(self) -> str:
        """This actor's path (for messages)."""
        return self.context.self_ref.path
