"""`ShardedReplica`: one replica of a `ShardedDataParallelTrainer` on one device.

It owns the positions `ShardLayout` gives it (its *piece*) and the
optimizer state of exactly that piece. What else it keeps depends on the
ZeRO stage:

| stage | parameters | gradients | optimizer state |
|---|---|---|---|
| 1 | full working copy + piece | full | piece |
| 2 | full working copy + piece | piece (the full sum lives from backward to reduce-scatter) | piece |
| 3 | piece (a layer is gathered for its forward and backward, then freed) | piece | piece |

Updates are atomic: `ApplyShard` writes the new piece and optimizer state
out of place (`DoubleBuffer`); `CommitShard` keeps them, `RollbackShard`
undoes them. Forward and backward never touch the piece.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from atomr.accel import CpuBackend, Device, DeviceActor
from atomr.actor import Failure, not_handled
from atomr.train._recovery import DoubleBuffer
from atomr.train.core._step_checks import check_loss
from atomr.train.core.checkpoint import CheckpointError, restored_optimizer
from atomr.train.core.config import TrainerConfig
from atomr.train.core.device_guard import REQUEST_ERRORS, Rejected, guarded
from atomr.train.core.messages import SetLearningRate
from atomr.train.core.model.layer import ForwardContext
from atomr.train.core.model.sequential import Sequential
from atomr.train.core.optimizer_state import Optimizer
from atomr.train.core.validation import cast_finite
from atomr.train.data_parallel.messages import EvaluateShard, ShardEval
from atomr.train.data_parallel.replica import evaluate_shard
from atomr.train.sharded._layers import LayerRunner
from atomr.train.sharded.layout import ShardLayout
from atomr.train.sharded.messages import (
    ApplyShard,
    BackwardLayer,
    CommitShard,
    ComputeShardGradients,
    ForwardLayer,
    GetShardMemory,
    GetShardState,
    Handed,
    RollbackShard,
    SetFullParams,
    SetShardState,
    ShardGradients,
    ShardLayerParams,
    ShardMemory,
    ShardReplicaState,
)

__all__ = ["ShardedReplica"]

# the messages of one pass design only (`ShardedReplicaProtocol`'s stage column)
_STAGES_1_2_ONLY = (ComputeShardGradients, SetFullParams, EvaluateShard)
_STAGE_3_ONLY = (ShardLayerParams, ForwardLayer, BackwardLayer)


class ShardedReplica(DeviceActor):
    """One sharded replica (module docstring); its trainer drives it.

    Args:
        model: the model (its initial weights; the replica keeps the parts
            its stage says, on `device`).
        device: a `Device` or its name.
        config: optimizer and loss.
        stage: the ZeRO stage, 1, 2 or 3.
        layout: the owned positions of every local replica.
        index: this replica's index among the local replicas.
    """

    def __init__(
        self,
        model: Sequential,
        device: Device | str,
        config: TrainerConfig,
        stage: int,
        layout: ShardLayout,
        index: int,
    ) -> None:
        super().__init__(device)
        self._template = model
        self.config = config
        self.stage = stage
        self.layout = layout
        self.index = index
        self.model: Sequential | None = None  # stages 1 and 2: the full working copy
        self.piece: Any = None
        self.grad_piece: Any = None
        self.optimizer: Optimizer | None = None
        self.steps = 0
        self._offsets = layout.piece_offsets(index)
        self._owned = layout.owned(index)
        self._undo = DoubleBuffer()
        self._undo_token = 0
        self._committed = 0  # the token of the update committed last
        self._handed: tuple[int, Any] | None = None  # (unit, buffer) awaiting its reduced sum
        self._peak = 0
        self._layers: LayerRunner | None = None
        self._handlers: dict[type, Callable[[Any], Any]] = {
            ComputeShardGradients: self.compute_gradients,
            ShardLayerParams: lambda m: self._layer_runner().hand_params(m.layer),
            ForwardLayer: lambda m: self._layer_runner().forward(m),
            BackwardLayer: self._backward_layer,
            ApplyShard: self.apply_shard,
            CommitShard: lambda m: self._commit(m.token),
            RollbackShard: lambda m: self._rollback(m.token),
            SetFullParams: lambda m: self._set_full(m.params),
            GetShardState: lambda _: self._state(),
            SetShardState: self.set_state,
            GetShardMemory: lambda _: self._memory(),
            EvaluateShard: self._evaluate_shard,
            SetLearningRate: self._set_lr,
        }

    # -- construction -------------------------------------------------------

    def _build(self) -> None:
        """On the device thread: this stage's buffers and the piece's optimizer."""
        be = self.backend
        host = self._template.get_params()
        if self.stage < 3:
            self.model = self._template.to(self.device)
            if self.stage == 2:
                self.model.grads = None  # allocated for each backward only
        self.piece = be.to_device(self.layout.take(host, self.index))
        if self.stage > 1:
            self.grad_piece = be.zeros((self.piece.shape[0],), dtype=host.dtype)
        self.optimizer = self.config.optimizer.create(self.piece.shape[0], be, host.dtype)

    def _layer_runner(self) -> LayerRunner:
        if self._layers is None:
            self._layers = LayerRunner(self, self._template)
        return self._layers

    @property
    def worker_index(self) -> int:
        """This replica's index (how `atomr.testkit.inject_faults(worker=k)` finds it)."""
        return self.index

    @property
    def shares_memory(self) -> bool:
        """The device's memory is host memory: buffers are handed without a copy."""
        return isinstance(self.backend, CpuBackend)

    def hand(self, buffer: Any, unit: int | None = None) -> Handed:
        """Hand `buffer` to the trainer (itself on a CPU device, else a host
        copy); with `unit`, remember it until its reduced sum is kept."""
        self._peak = max(self._peak, int(buffer.nbytes))
        if unit is not None:
            self._handed = (unit, buffer)
        if self.shares_memory:
            return Handed(buffer, True)
        return Handed(np.asarray(self.backend.to_host(buffer)), False)

    # -- dispatch -----------------------------------------------------------

    async def receive(self, message: Any) -> Any:
        """Answer a message of `atomr.train.sharded.messages` on the device thread."""
        handler = self._handlers.get(type(message))
        if handler is None:
            return not_handled("ShardedReplica", message)
        wrong_stage = self._wrong_stage(message)
        if wrong_stage is not None:
            return Failure(wrong_stage)
        if self.optimizer is None:
            await self.on_device(self._build)
        try:
            result = await self.on_device(guarded, handler, message)
        except REQUEST_ERRORS as exc:
            return Failure(exc)
        if isinstance(result, Rejected):
            return Failure(result.error)
        return result

    def _wrong_stage(self, message: Any) -> TypeError | None:
        """Why `message` does not apply at this replica's stage, or None."""
        if self.stage == 3 and isinstance(message, _STAGES_1_2_ONLY):
            only = "1 and 2"
        elif self.stage < 3 and isinstance(message, _STAGE_3_ONLY):
            only = "3"
        else:
            return None
        return TypeError(
            f"{type(message).__name__} is for ZeRO stage {only} only; "
            f"this replica runs stage {self.stage}"
        )

    # -- stages 1 and 2 -------------------------------------------------------

    def compute_gradients(self, msg: ComputeShardGradients) -> ShardGradients:
        """Forward, loss and backward of one shard into the full gradient
        buffer (worker thread); hands the buffer over.

        Raises:
            NonFiniteError: the loss is not finite (nothing changed).
        """
        model = self.model
        assert model is not None
        be = model.backend
        if model.grads is None:
            model.grads = be.empty((model.n_params,), dtype=model.dtype)
        x, y = msg.features, msg.labels  # validated by the trainer
        loss_sum, norm = 0.0, 0.0
        if x.shape[0] == 0:
            model.zero_grads()
        else:
            ctx = ForwardContext(True, self.steps, msg.sample_offset)
            tape = model.forward_train(be.to_device(x), ctx)
            d_out = be.empty(tape.output.shape, dtype=model.dtype)
            loss_sum, norm = self.config.loss.sums(be, tape.output, be.to_device(y), d_out)
            check_loss(loss_sum)
            model.backward(tape, d_out)
        be.synchronize()
        handed = self.hand(model.grads, unit=0)
        return ShardGradients(float(loss_sum), float(norm), int(x.shape[0]), handed)

    def keep_reduced(self, reduced: np.ndarray | None) -> None:
        """Take this replica's positions of the last handed unit's reduced sum
        into the gradient piece (worker thread); free a transient buffer.

        Args:
            reduced: the reduced buffer when the handed one was a copy.

        Raises:
            ValueError: nothing was handed, or `reduced` has the wrong length.
        """
        if self._handed is None:
            raise ValueError("no gradient was handed over to reduce")
        unit, buffer = self._handed
        self._handed = None
        lo, hi = self._owned[unit]
        if hi == lo and self.stage == 3:  # nothing of this layer is this replica's
            return
        source = buffer
        if reduced is not None:
            if reduced.shape != tuple(buffer.shape):
                raise ValueError(f"reduced has shape {reduced.shape}, expected {buffer.shape}")
            source = self.backend.to_device(np.ascontiguousarray(reduced, dtype=buffer.dtype))
        start = self.layout.units[unit][0]
        at = self._offsets[unit]
        if self.stage == 1:
            if reduced is not None:
                self.backend.copy(source[lo - start : hi - start], buffer[lo - start : hi - start])
            self.grad_piece = buffer[lo - start : hi - start]  # a view: the full buffer stays
            return
        self.backend.copy(source[lo - start : hi - start], self.grad_piece[at : at + hi - lo])
        if self.stage == 2:
            assert self.model is not None
            self.model.grads = None  # stage 2 keeps only the piece

    def apply_shard(self, msg: ApplyShard) -> None:
        """The optimizer step of the piece by its mean, clipped gradient, out
        of place and pending (worker thread).

        Raises:
            NonFiniteError: a new weight would be non-finite (nothing changed).
        """
        self.keep_reduced(msg.reduced)
        be, g = self.backend, self.grad_piece
        opt = self.optimizer
        assert opt is not None
        be.scale(g, msg.scale)
        if msg.coefficient < 1.0:
            be.scale(g, msg.coefficient)
        self._undo.apply(be, self, "piece", opt, g)
        self._undo_token = msg.token

    def _commit(self, token: int) -> Handed | None:
        """Keep the pending update; stages 1 and 2 write the new piece into
        the working copy and hand it over for the all-gather. Asked again
        for the update it committed last (its answer was late), it only
        hands the working copy over again.

        Raises:
            ValueError: `token` is neither the pending update nor the last committed.
        """
        committed_last = not self._undo.pending and self._committed == token
        if not committed_last:
            if not self._undo.pending or self._undo_token != token:
                raise ValueError(f"update {token} is not pending")
            self._undo.commit()
            self._committed = token
            self.steps += 1
        if self.model is None:
            return None
        params = self.model.params
        if not committed_last:
            for (lo, hi), at in zip(self._owned, self._offsets, strict=False):
                self.backend.copy(self.piece[at : at + hi - lo], params[lo:hi])
            self.backend.synchronize()
        return self.hand(params)

    def _rollback(self, token: int) -> bool:
        if not self._undo.pending or self._undo_token != token:
            return False
        self._undo.rollback()
        return True

    def _evaluate_shard(self, msg: EvaluateShard) -> ShardEval:
        """Stages 1 and 2: loss sums and correct rows of one shard (worker thread)."""
        assert self.model is not None
        return evaluate_shard(self.model, self.config.loss, msg)

    def _set_lr(self, msg: SetLearningRate) -> float:
        assert self.optimizer is not None
        return self.optimizer.set_lr(msg.lr)

    def _set_full(self, params: np.ndarray) -> None:
        assert self.model is not None
        self.model.set_params(params, checked=False)  # gathered from stepped shards

    # -- stage 3 ------------------------------------------------------------

    def _backward_layer(self, msg: BackwardLayer) -> Handed:
        if self._handed is not None:
            self.keep_reduced(msg.reduced_above)
        return self._layer_runner().backward(msg)

    # -- state --------------------------------------------------------------

    def _state(self) -> ShardReplicaState:
        opt = self.optimizer
        assert opt is not None
        piece = np.array(self.backend.to_host(self.piece), copy=True)
        return ShardReplicaState(piece, opt.state_dict(), self.steps)

    def set_state(self, msg: SetShardState) -> None:
        """Load a piece, its optimizer state and the step count (worker thread).

        Raises:
            CheckpointError: the piece (of another length, or not finite in
                the model's dtype: `cast_finite`) or the optimizer state does
                not fit.
            TypeError, ValueError: `full` is not parameters of the model
                (`Sequential.set_params`). Nothing has changed.
        """
        state, n = msg.state, self._offsets[-1]
        piece = np.asarray(state.piece)
        if piece.shape != (n,):
            raise CheckpointError(f"replica {self.index} owns {n} values, got {piece.shape}")
        dtype = self._template.dtype
        piece = cast_finite(piece, dtype, f"replica {self.index}'s piece values", CheckpointError)
        kind = self.config.optimizer
        fresh = (
            restored_optimizer(
                kind, n, state.optimizer, self.backend, dtype, f"replica {self.index}"
            )
            if state.optimizer
            else kind.create(n, self.backend, dtype)
        )
        if self.model is not None and msg.full is not None:
            self.model.set_params(msg.full)
        self.piece = self.backend.to_device(piece)
        self.optimizer = fresh
        self.steps = int(state.steps)
        self._undo = DoubleBuffer()
        self._handed = None

    def _memory(self) -> ShardMemory:
        def size(*buffers: Any) -> int:
            return sum(int(b.nbytes) for b in buffers if b is not None)

        opt = self.optimizer
        assert opt is not None
        weights = size(self.piece)
        gradients = size(self.grad_piece) if self.stage > 1 else 0
        if self.model is not None:
            weights += size(self.model.params)
            if self.stage == 1:
                gradients = size(self.model.grads)
        state = size(*opt.buffers().values())
        return ShardMemory(weights, gradients, state, self._undo.nbytes, self._peak)

    def note_transient(self, nbytes: int) -> None:
        """Record a transient buffer's size for `ShardMemory.gathered_peak`."""
        self._peak = max(self._peak, int(nbytes))
