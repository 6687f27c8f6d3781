"""`ReplicaActor`: the built-in data-parallel replica, a model with its
optimizer and gradient buffer on one device, answering `ReplicaProtocol`
(`atomr.train.data_parallel.messages`) and the ring messages.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from atomr.accel import CpuBackend, Device
from atomr.actor import Failure, Props, not_handled
from atomr.train._recovery import DoubleBuffer
from atomr.train.comm.ring import RingMember
from atomr.train.core._step_checks import check_gradient, check_loss
from atomr.train.core.checkpoint import Checkpoint, check_model_matches, restored_optimizer
from atomr.train.core.clip import clip_grad_norm
from atomr.train.core.config import TrainerConfig
from atomr.train.core.device_guard import REQUEST_ERRORS, Rejected, guarded
from atomr.train.core.errors import InvalidBatchError
from atomr.train.core.messages import SetLearningRate, Step
from atomr.train.core.model.inputs import real_vector
from atomr.train.core.model.layer import ForwardContext
from atomr.train.core.model.sequential import Sequential
from atomr.train.data_parallel.messages import (
    ApplyReducedGradients,
    ComputeGradients,
    EvaluateShard,
    GetDevice,
    GetGradients,
    GetState,
    GradientResult,
    ReplicaState,
    Rollback,
    SetGradients,
    SetState,
    ShardEval,
)
from atomr.train.trainer import Trainer

__all__ = ["ReplicaActor", "evaluate_shard", "worker_deadline"]


def worker_deadline(config: TrainerConfig) -> float:
    """Seconds to wait for one reply of a replica (or one ring chunk):
    `config.worker_timeout`, or `math.inf` (forever) when it is None."""
    return math.inf if config.worker_timeout is None else float(config.worker_timeout)


class ReplicaActor(Trainer):
    """The built-in replica: a model (any `Sequential`), its optimizer and its gradient buffer
    on one device, answering `ReplicaProtocol` and the ring messages.

    It is a `Trainer` (same construction and `props`, same `GetWeights`,
    `Evaluate`, checkpoints) that refuses `Step`: a replica only steps
    through its data-parallel trainer.

    Its work runs on the device's worker thread in hooks that subclasses may
    override (an instrumented replica, a fault-injected one:
    `atomr.testkit.inject_faults`, given to `DataParallelOptions.replica_class`):
    `compute_gradients`, `apply_gradients`, `set_state`, and the ring
    buffer's `read_chunk`, `add_chunk`, `write_chunk` (on the event loop,
    awaiting the device).

    Args:
        model: the initial model (copied onto `device` at start; the trainer
            overwrites the weights with replica 0's).
        device: a `Device` or its name.
        config: optimizer, loss and clipping (accumulation is driven by the
            trainer); `worker_timeout` is also how long the replica waits for
            one ring chunk (None: forever).
        index: this replica's rank among its trainer's replicas, its
            `worker_index` (`DataParallelTrainer.spawn` numbers them).

    Raises:
        TypeError: `model` is not a `Sequential` or `config` not a `TrainerConfig`.
        ValueError: a bad device name.
    """

    def __init__(
        self, model: Sequential, device: Device | str, config: TrainerConfig, index: int = 0
    ) -> None:
        super().__init__(model, device, config)
        self.index = index
        self._ring = RingMember(self, timeout=worker_deadline(config))
        # the weights and optimizer state before the last apply are kept, for `Rollback`
        self._undo = DoubleBuffer()
        self._undo_token = 0
        self._undo_steps = 0
        self._handlers: dict[type, tuple[Callable[[Any], Any], bool]] = {
            ComputeGradients: (self.compute_gradients, True),
            ApplyReducedGradients: (self.apply_gradients, True),
            Rollback: (lambda m: self._rollback(m.token), False),
            GetState: (lambda _: self._get_state(), False),
            SetState: (lambda m: self.set_state(m.state), True),
            EvaluateShard: (self._evaluate_shard, True),
            GetGradients: (lambda _: self._gradients(), False),
            SetGradients: (lambda m: self._set_gradients(m.gradients), True),
            GetDevice: (lambda _: self.device, False),
            SetLearningRate: (self._set_lr, False),  # answers the rate it replaces
        }

    @classmethod
    def props(
        cls,
        model: Sequential,
        devices: Device | str | Sequence[Device | str],
        config: TrainerConfig,
        options: None = None,
        *,
        index: int = 0,
    ) -> Props:
        """The `Props` of replica `index`, its arguments checked as `Trainer.props` does.

        Returns:
            The Props.

        Raises:
            TypeError, ValueError: as `Trainer.props`.
        """
        checked = super().props(model, devices, config, options)
        return Props(cls, *checked.args, index=index)

    @property
    def worker_index(self) -> int:
        """This replica's rank: how `atomr.testkit.inject_faults(worker=k)` finds it."""
        return self.index

    # -- dispatch -----------------------------------------------------------

    def refuse(self, message: Any) -> Failure:
        """The answer to a message this replica does not handle: a plain
        `TypeError` (a trainer's hint at `Step` would mislead: step its trainer)."""
        return not_handled(type(self).__name__, message)

    async def receive(self, message: Any) -> Any:
        """Answer a `ReplicaProtocol` or ring message; other trainer messages
        as `Trainer` does, except `Step` (answered with a `TypeError`)."""
        handler = self._handlers.get(type(message))
        if handler is None:
            if RingMember.handles(message):
                await self._ready()
                return self._ring.receive(message, self.context)
            if isinstance(message, Step):
                return Failure(
                    TypeError(
                        f"{type(self).__name__} does not handle Step; step its trainer instead"
                    )
                )
            return await super().receive(message)
        await self._ready()
        work, checked = handler
        try:
            if checked:  # a device failure inside fails the actor, bad input is answered
                result = await self.on_device(guarded, work, message)
            else:
                result = await self.on_device(work, message)
        except REQUEST_ERRORS as exc:
            return Failure(exc)
        if isinstance(result, Rejected):
            return Failure(result.error)
        return result

    # -- RingBuffer (the gradient buffer) -------------------------------------

    @property
    def ring_size(self) -> int:
        """Elements of the gradient buffer (the model's parameter count)."""
        assert self.model is not None
        return int(self.model.n_params)

    def _dev(self, host: np.ndarray) -> Any:
        """`host` in the device's memory (on a CPU device, itself: no copy)."""
        be = self.backend
        return host if isinstance(be, CpuBackend) else be.to_device(host)

    async def read_chunk(self, lo: int, hi: int) -> np.ndarray:
        """Gradient elements `lo:hi`, for reading only: on a CPU device a view
        (no copy, no trip to the device thread: the last write to the chunk
        was awaited), else a host copy made on the device thread."""
        assert self.model is not None
        grads = self.model.grads
        if isinstance(self.backend, CpuBackend):
            return np.asarray(grads[lo:hi])  # a view
        return await self.on_device(lambda: np.asarray(self.backend.to_host(grads[lo:hi])))

    async def add_chunk(self, lo: int, hi: int, data: np.ndarray) -> None:
        """`grads[lo:hi] += data` (on the device thread)."""
        assert self.model is not None
        grads = self.model.grads
        await self.on_device(lambda: self.backend.axpy(1.0, self._dev(data), grads[lo:hi]))

    async def write_chunk(self, lo: int, hi: int, data: np.ndarray) -> None:
        """`grads[lo:hi] = data` (on the device thread)."""
        assert self.model is not None
        grads = self.model.grads
        await self.on_device(lambda: self.backend.copy(self._dev(data), grads[lo:hi]))

    # -- device-side work -----------------------------------------------------

    def _set_lr(self, msg: SetLearningRate) -> float:
        """`SetLearningRate`: the rate it replaces, which the trainer gives
        back to every replica when another one fails to take the new one."""
        assert self.optimizer is not None
        return self.optimizer.set_lr(msg.lr)

    def _gradients(self) -> np.ndarray:
        """A host copy of the gradient buffer (worker thread)."""
        assert self.model is not None
        return np.array(self.backend.to_host(self.model.grads), copy=True)

    def _set_gradients(self, gradients: Any) -> None:
        """Overwrite the gradient buffer (worker thread).

        Raises:
            TypeError: not real numbers.
            ValueError: not the parameters' length, or not finite in the
                model's dtype (`real_vector`).
        """
        assert self.model is not None
        flat = real_vector("gradients", gradients, self.model.dtype)
        if flat.shape[0] != self.model.n_params:
            raise ValueError(f"gradients must be {self.model.n_params} values, got {flat.shape[0]}")
        self.backend.upload(flat, self.model.grads)

    def compute_gradients(self, msg: ComputeGradients) -> GradientResult:
        """The gradient of one shard of a batch (worker thread): forward,
        loss, backward into the gradient buffer; no weight changes.

        Args:
            msg: the shard (validated by the trainer's `validate_batch`), and
                whether to accumulate into the buffer and to return a host
                copy of it.

        Returns:
            The shard's `GradientResult`.

        Raises:
            NonFiniteError: the loss is not finite, or the gradient buffer
                is not when `msg.check_gradient` (no weight changed).
        """
        model = self.model
        assert model is not None
        be = model.backend
        t0 = time.perf_counter_ns()
        self._undo.commit()  # a new step: the previous one can no longer be undone
        x, y = msg.features, msg.labels  # validated by the trainer (`validate_batch`)
        loss_sum, norm = 0.0, 0.0
        if x.shape[0] == 0:
            if not msg.accumulate:
                model.zero_grads()
        else:
            ctx = ForwardContext(True, self.steps, msg.sample_offset)
            tape = model.forward_train(self._dev(x), ctx)
            d_out = be.empty(tape.output.shape, dtype=model.dtype)
            loss_sum, norm = self.config.loss.sums(be, tape.output, self._dev(y), d_out)
            check_loss(loss_sum)
            model.backward(tape, d_out, accumulate=msg.accumulate)
            if msg.check_gradient:  # a micro-step no reduction checks
                check_gradient(be.squared_norm(model.grads), "micro-step")
        be.synchronize()
        grads = None
        if msg.return_gradients:
            grads = model.grads if isinstance(be, CpuBackend) else be.to_host(model.grads)
        micros = (time.perf_counter_ns() - t0) // 1000
        return GradientResult(float(loss_sum), float(norm), int(x.shape[0]), int(micros), grads)

    def apply_gradients(self, msg: ApplyReducedGradients) -> float | None:
        """Apply the reduced gradient (worker thread): scale, clip, optimizer
        step out of place, swapped in only once complete; the old weights and
        optimizer state are kept for `Rollback(msg.token)`.

        Args:
            msg: the gradient (None: the buffer the ring reduced), scale, clip
                and the step's token.

        Returns:
            The gradient's norm (None when the gradient was sent).

        Raises:
            InvalidBatchError: a sent gradient of the wrong shape.
            NonFiniteError: the gradient is not finite (nothing applied).
        """
        model, opt = self.model, self.optimizer
        assert model is not None and opt is not None
        be = model.backend
        grad_norm: float | None = None
        if msg.gradients is None:
            g = model.grads  # its own buffer: the unchecked kernel
            grad_norm = math.sqrt(be.sum_scale_norm_unchecked(g, (g,), g.dtype.type(msg.scale)))
            check_gradient(grad_norm)
            if msg.clip is not None:
                clip_grad_norm(be, g, msg.clip, grad_norm)
        else:
            host = msg.gradients
            if not isinstance(host, np.ndarray) or host.shape != (model.n_params,):
                raise InvalidBatchError(f"gradients must be a ({model.n_params},) array")
            g = self._dev(np.ascontiguousarray(host, dtype=model.dtype))
        self._undo.apply(be, model, "params", opt, g)  # out of place, then swapped in
        self._undo_token = msg.token
        self._undo_steps = self.steps
        self.steps += 1
        return grad_norm

    def _rollback(self, token: int) -> bool:
        model, opt = self.model, self.optimizer
        assert model is not None and opt is not None
        if not self._undo.pending or self._undo_token != token:
            return False
        self._undo.rollback()
        self.steps = self._undo_steps
        return True

    def _get_state(self) -> ReplicaState:
        model, opt = self.model, self.optimizer
        assert model is not None and opt is not None
        return ReplicaState(model.config(), model.get_params(), opt.state_dict(), self.steps)

    def set_state(self, state: ReplicaState) -> None:
        """Load weights, optimizer state and step count (worker thread).

        Raises:
            TypeError: `state` is not a `ReplicaState`.
            CheckpointError: it is for another model, or its optimizer state
                does not fit.
        """
        model = self.model
        assert model is not None
        if not isinstance(state, ReplicaState):
            raise TypeError(f"SetState needs a ReplicaState, got {type(state).__name__}")
        kind, n, be, dtype = self.config.optimizer, model.n_params, model.backend, model.dtype
        weights = np.asarray(state.weights).reshape(-1)
        check_model_matches(Checkpoint(state.model, weights, state.steps), model.config(), n, dtype)
        if state.optimizer:
            fresh = restored_optimizer(kind, n, state.optimizer, be, dtype, f"replica {self.index}")
        else:
            fresh = kind.create(n, be, dtype)
        model.set_params(state.weights)
        self.optimizer = fresh
        self.steps = int(state.steps)
        self._undo.commit()
        self._reset_accumulation()

    def _evaluate_shard(self, msg: EvaluateShard) -> ShardEval:
        assert self.model is not None
        return evaluate_shard(self.model, self.config.loss, msg)


def evaluate_shard(model: Sequential, loss: Any, msg: EvaluateShard) -> ShardEval:
    """The loss sums and correct rows of one shard of a batch, validated by
    the trainer (worker thread; any replica with a whole model).

    Args:
        model: the replica's model.
        loss: the trainer's `LossKind`.
        msg: the shard.

    Returns:
        Its `ShardEval`.
    """
    be = model.backend
    x, y = msg.features, msg.labels
    if x.shape[0] == 0:
        return ShardEval(0.0, 0.0, 0, 0)
    out = model.forward(be.to_device(x))
    d_out = be.empty(out.shape, dtype=model.dtype)
    loss_sum, norm = loss.sums(be, out, be.to_device(y), d_out)
    correct = 0
    if loss.is_classification:
        correct = int(np.sum(np.argmax(be.to_host(out), axis=-1) == y))
    return ShardEval(float(loss_sum), float(norm), correct, int(x.shape[0]))
