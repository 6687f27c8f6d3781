"""`ReplicaProtocol`: the messages a data-parallel replica answers, and
`ReplicaActor`, the built-in replica of an `Mlp` on one device.

`DataParallelTrainer` never looks inside a replica: it only sends these
messages, so any actor that answers them can be a replica (bring your own
model, device or framework):

| message | reply | phase |
|---|---|---|
| `ComputeGradients(features, labels, accumulate, return_gradients)` | `GradientResult` | 1: compute, change no weights |
| `ApplyGradients(gradients, scale, clip, token)` | grad norm (`float`) or None | 2: update, the old state kept |
| `Rollback(token)` | `bool` (restored) | undo the `ApplyGradients` of `token` |
| `GetState()` | `ReplicaState` | re-sync source |
| `SetState(state)` | None | re-sync target / initial broadcast / checkpoint load (and its undo) |
| `GetWeights()` | `ndarray` (flat, `Mlp.params` layout) | `GetReplicaWeights`, checks |
| `EvaluateShard(features, labels)` | `ShardEval` | `Evaluate` |
| ring messages (`ring_all_reduce.py`) | | only with `collective="ring"` |

Contract of the gradient: `ComputeGradients` leaves in the replica's
gradient buffer the gradient of the loss *sum* of its shard (not the mean):
the trainer adds the buffers of all replicas and divides once by the total
normaliser, which is exact for any split. With `accumulate=True` the
gradient is added to the buffer instead of replacing it (micro-steps of
gradient accumulation; nothing is exchanged until the last one). A shard
may have 0 rows (a batch smaller than the number of replicas): the replica
then contributes a zero gradient (or leaves its accumulated one unchanged).

Contract of the update: `ApplyGradients(gradients=g)` applies the given
final gradient; `ApplyGradients(gradients=None, scale=s, clip=c)` first
turns its *own* buffer (which holds the all-reduced sum after a ring
all-reduce) into the final gradient: multiply by `s`, take the global norm,
refuse with `NonFiniteError` (nothing changed) if it is not finite, clip to
`c`. Either way the replica writes the new weights and optimizer state out
of place and keeps the old ones (`recovery.DoubleBuffer`, no copy) under
`token`, so that `Rollback(token)` can undo the update if another replica
failed to apply it. Every replica applies the same bits with the
same optimizer, so replicas stay bit-identical.

Bad requests are answered with `Failure(exc)` and change nothing; a device
failure fails the actor (its supervisor restarts it and the trainer re-syncs
it with `SetState` from a healthy replica).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from atomr.accel import CpuBackend, Device
from atomr.actor import Failure, Props
from atomr.train._recovery import DoubleBuffer
from atomr.train.comm.ring import RingMember
from atomr.train.core.checkpoint import CheckpointError, check_model_matches
from atomr.train.core.clip import clip_grad_norm
from atomr.train.core.config import TrainerConfig
from atomr.train.core.device_guard import REQUEST_ERRORS, Rejected, guarded
from atomr.train.core.errors import InvalidBatchError
from atomr.train.core.messages import Step
from atomr.train.core.mlp import Mlp
from atomr.train.core.step_checks import check_gradient, check_loss
from atomr.train.trainer import Trainer

__all__ = [
    "ApplyGradients",
    "ComputeGradients",
    "EvaluateShard",
    "GetState",
    "GradientResult",
    "ReplicaActor",
    "ReplicaState",
    "Rollback",
    "SetState",
    "ShardEval",
]


# ---------------------------------------------------------------- protocol


@dataclass(frozen=True, eq=False)
class ComputeGradients:
    """Phase 1: forward + backward on a shard, weights untouched; answered
    with `GradientResult`.

    Attributes:
        features: `(rows, in_width)` float array (rows may be 0).
        labels: labels or targets of the rows, as for `Step`.
        accumulate: add the gradient to the buffer instead of replacing it.
        return_gradients: put a host view of the gradient buffer in the reply
            (the host collective sums them).
    """

    features: np.ndarray
    labels: np.ndarray
    accumulate: bool = False
    return_gradients: bool = False


@dataclass(frozen=True, eq=False)
class GradientResult:
    """What a replica computed on its shard.

    Attributes:
        loss_sum: the shard's loss sum.
        normaliser: the shard's normaliser (rows, elements for MSE, or the
            sum of the targets' class weights).
        samples: rows in the shard.
        micros: compute time on the device, in microseconds.
        gradients: host view (CPU) or copy (GPU) of the gradient buffer when
            asked for, else None; valid until the replica's next message.
    """

    loss_sum: float
    normaliser: float
    samples: int
    micros: int
    gradients: np.ndarray | None = None


@dataclass(frozen=True, eq=False)
class ApplyGradients:
    """Phase 2: one optimizer step, the old state kept; answered with the global
    gradient norm when the replica finalised its own buffer, else None.

    Attributes:
        gradients: the final gradient (host array), or None to use the
            replica's own buffer after scaling and clipping it.
        scale: factor applied to the own buffer (`1 / total normaliser`).
        clip: clip the own buffer's norm to this value (None: no clipping).
        token: identifies the step for `Rollback`.
    """

    gradients: np.ndarray | None = None
    scale: float = 1.0
    clip: float | None = None
    token: int = 0


@dataclass(frozen=True, slots=True)
class Rollback:
    """Undo the `ApplyGradients` of `token` (swap its old state back); answered
    with True if something was restored.

    Attributes:
        token: the step's token.
    """

    token: int


@dataclass(frozen=True, slots=True)
class GetState:
    """Ask for the replica's full state; answered with `ReplicaState`."""


@dataclass(frozen=True, eq=False)
class ReplicaState:
    """Everything that makes two replicas identical.

    Attributes:
        model: the model config (`Mlp.config()`).
        weights: flat host weight vector.
        optimizer: the optimizer's `state_dict()` (empty: a fresh optimizer).
        steps: optimizer steps applied so far.
    """

    model: dict[str, Any]
    weights: np.ndarray
    optimizer: dict[str, Any] = field(default_factory=dict)
    steps: int = 0


@dataclass(frozen=True, eq=False)
class SetState:
    """Replace the replica's weights, optimizer state and step count;
    answered with None.

    Attributes:
        state: the state to take.
    """

    state: ReplicaState


@dataclass(frozen=True, eq=False)
class EvaluateShard:
    """Loss sums and correct predictions on a shard, nothing changed;
    answered with `ShardEval`.

    Attributes:
        features: `(rows, in_width)` float array (rows may be 0).
        labels: labels or targets, as for `Step`.
    """

    features: np.ndarray
    labels: np.ndarray


@dataclass(frozen=True, slots=True)
class ShardEval:
    """The sums of an evaluation shard.

    Attributes:
        loss_sum: loss sum.
        normaliser: the loss's normaliser.
        correct: rows whose arg-max equals the label (0 for MSE).
        samples: rows.
    """

    loss_sum: float
    normaliser: float
    correct: int
    samples: int


_PROTOCOL = (ComputeGradients, ApplyGradients, Rollback, GetState, SetState, EvaluateShard)


# ---------------------------------------------------------------- the actor


class ReplicaActor(Trainer):
    """The built-in replica: an `Mlp`, its optimizer and its gradient buffer
    on one device, answering `ReplicaProtocol` (module docstring) and the
    ring messages.

    It is a `Trainer` (same construction, same `GetWeights`, `Evaluate`,
    checkpoints) that refuses `Step`: a replica only steps through its
    data-parallel trainer.

    Args:
        model: the initial model (copied onto `device` at start; the trainer
            overwrites the weights with replica 0's).
        device: a `Device` or its name.
        config: optimizer, loss and clipping (accumulation is driven by the
            trainer).
        ring_timeout: seconds to wait for one ring chunk.
    """

    def __init__(
        self,
        model: Mlp,
        device: Device | str,
        config: TrainerConfig,
        ring_timeout: float = 60.0,
    ) -> None:
        super().__init__(model, device, config)
        self._ring = RingMember(self, timeout=ring_timeout)
        # the weights and optimizer state before the last apply are kept, for `Rollback`
        self._undo = DoubleBuffer()
        self._undo_token = 0
        self._undo_steps = 0

    @classmethod
    def props(
        cls,
        model: Mlp,
        device: Device | str,
        config: TrainerConfig,
        ring_timeout: float = 60.0,
    ) -> Props:
        """The `Props` of a replica (arguments as for the class)."""
        return Props(cls, model, device, config, ring_timeout)

    # -- dispatch -----------------------------------------------------------

    async def receive(self, message: Any) -> Any:
        """Answer a `ReplicaProtocol` or ring message (module docstring);
        other trainer messages as `Trainer` does, except `Step`."""
        if RingMember.handles(message):
            await self._ready()
            return self._ring.receive(message, self.context)
        if isinstance(message, Step):
            return Failure(TypeError("a replica does not take Step; step its trainer instead"))
        if not isinstance(message, _PROTOCOL):
            return await super().receive(message)
        model = await self._ready()
        try:
            if isinstance(message, ComputeGradients):
                result = await self.on_device(guarded, self._compute, message)
            elif isinstance(message, ApplyGradients):
                result = await self.on_device(guarded, self._apply_gradients, message)
            elif isinstance(message, Rollback):
                result = await self.on_device(self._rollback, message.token)
            elif isinstance(message, GetState):
                result = await self.on_device(self._get_state)
            elif isinstance(message, SetState):
                result = await self.on_device(guarded, self._set_state, message.state)
            else:
                result = await self.on_device(guarded, self._evaluate_shard, message)
        except REQUEST_ERRORS as exc:
            return Failure(exc)
        del model
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

    def _compute(self, msg: ComputeGradients) -> GradientResult:
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
            tape = model.forward_train(be.to_device(x))
            d_out = be.empty(tape.output.shape, dtype=model.dtype)
            loss_sum, norm = self.config.loss.sums(be, tape.output, be.to_device(y), d_out)
            check_loss(loss_sum)
            model.backward(tape, d_out, accumulate=msg.accumulate)
        be.synchronize()
        grads = None
        if msg.return_gradients:
            grads = model.grads if isinstance(be, CpuBackend) else be.to_host(model.grads)
        micros = (time.perf_counter_ns() - t0) // 1000
        return GradientResult(float(loss_sum), float(norm), int(x.shape[0]), int(micros), grads)

    def _apply_gradients(self, msg: ApplyGradients) -> float | None:
        model, opt = self.model, self.optimizer
        assert model is not None and opt is not None
        be = model.backend
        grad_norm: float | None = None
        if msg.gradients is None:
            g = model.grads
            grad_norm = math.sqrt(be.sum_scale_norm(g, [g], float(msg.scale)))
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

    def _set_state(self, state: ReplicaState) -> None:
        model = self.model
        assert model is not None
        if not isinstance(state, ReplicaState):
            raise TypeError(f"SetState needs a ReplicaState, got {type(state).__name__}")
        from atomr.train.core.checkpoint import Checkpoint

        check_model_matches(
            Checkpoint(state.model, np.asarray(state.weights).reshape(-1), state.steps),
            model.config(),
            model.n_params,
        )
        fresh = self.config.optimizer.create(model.n_params, model.backend, model.dtype)
        if state.optimizer:
            try:
                fresh.load_state_dict(state.optimizer)
            except (KeyError, ValueError, TypeError) as exc:
                raise CheckpointError(f"optimizer state does not fit: {exc}") from exc
        model.set_params(state.weights)
        self.optimizer = fresh
        self.steps = int(state.steps)
        self._undo.commit()
        self._reset_accumulation()

    def _evaluate_shard(self, msg: EvaluateShard) -> ShardEval:
        model = self.model
        assert model is not None
        be = model.backend
        x, y = msg.features, msg.labels  # validated by the trainer (`validate_batch`)
        if x.shape[0] == 0:
            return ShardEval(0.0, 0.0, 0, 0)
        out = model.forward(be.to_device(x))
        d_out = be.empty(out.shape, dtype=model.dtype)
        loss_sum, norm = self.config.loss.sums(be, out, be.to_device(y), d_out)
        correct = 0
        if self.config.loss.is_classification:
            correct = int(np.sum(np.argmax(be.to_host(out), axis=1) == y))
        return ShardEval(float(loss_sum), float(norm), correct, int(x.shape[0]))
