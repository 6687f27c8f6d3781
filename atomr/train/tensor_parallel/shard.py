"""`ShardActor`: the built-in tensor-parallel shard, one slice of an `Mlp`
on one device.

It answers `ShardProtocol` (`atomr.train.tensor_parallel.messages`) with the
Megatron-LM column/row split of `atomr.train.tensor_parallel.sharding`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from atomr.accel import Device, DeviceActor
from atomr.actor import Failure, Props
from atomr.train._recovery import DoubleBuffer
from atomr.train.core.device_guard import Rejected, guarded
from atomr.train.core.errors import CheckpointError
from atomr.train.core.loss import LossKind
from atomr.train.core.messages import SetLearningRate
from atomr.train.core.mlp import Mlp
from atomr.train.core.optimizer import OptimizerKind
from atomr.train.core.optimizer_state import Optimizer
from atomr.train.core.step_checks import check_loss, check_normaliser
from atomr.train.tensor_parallel.messages import (
    LossResult,
    ShardApply,
    ShardBackward,
    ShardConfigure,
    ShardDescribe,
    ShardForward,
    ShardGather,
    ShardGetState,
    ShardGrad,
    ShardInfo,
    ShardLoss,
    ShardRollback,
    ShardSetState,
    ShardSlice,
    ShardSliceState,
)
from atomr.train.tensor_parallel.sharding import LayerShard, ShardLayout, shard_layout, slice_state

__all__ = ["ShardActor"]

# Errors that reject a request (`device_guard.guarded` catches them on the
# worker thread); unlike the Trainer's, an OSError is a device failure here.


@dataclass
class _StageTape:
    """What a stage's forward keeps for its backward."""

    pre_input: Any  # the combined pre-activation input (stage > 0), else None
    a_in: Any  # the column layer's input
    h: Any  # the column layer's output (pre-activation)
    a: Any = None  # the row layer's input (activation of h)


class ShardActor(DeviceActor):
    """One tensor-parallel shard of an `Mlp` on one device (see the module docstring).

    Owns the slice `shard_layout(model.sizes, shard_count, rank)` of the
    model's weights, its gradients and its optimizer state, and answers
    `ShardProtocol`. All math runs on the device's worker thread, in hooks
    that subclasses may override (an instrumented shard, a fault-injected
    one: `atomr.testkit.inject_faults`): `forward_stage`, `compute_loss`,
    `backward_stage`, `sum_partials` (a row-parallel layer's all-reduce) and
    `apply_gradients`.

    Args:
        model: the full model; the shard copies its slice when it starts (the
            object is not modified).
        rank: this shard's position, `0 <= rank < shard_count`.
        shard_count: the number of shards.
        device: the shard's device (a `Device` or its name).

    Raises:
        TypeError: `model` is not an `Mlp`.
        ValueError: a sharded width is smaller than `shard_count`, bad rank,
            or a model with `activate_last` (not supported).
    """

    def __init__(self, model: Mlp, rank: int, shard_count: int, device: Device | str) -> None:
        super().__init__(device)
        if not isinstance(model, Mlp):
            raise TypeError(f"model must be an Mlp, got {type(model).__name__}")
        if model.activate_last:
            raise ValueError("tensor parallelism does not support models with activate_last")
        self.layout: ShardLayout = shard_layout(model.sizes, shard_count, rank)
        self._template = model
        self.activation = model.activation
        self.dtype = model.dtype
        self.params: Any = None
        self.grads: Any = None
        self.optimizer: Optimizer | None = None
        self.loss: LossKind | None = None
        self._tapes: list[_StageTape | None] = [None] * self.layout.stages
        self._batch = 0
        self._d_out: Any = None
        self._undo = DoubleBuffer()
        self._pending = False

    @classmethod
    def props(cls, model: Mlp, rank: int, shard_count: int, device: Device | str) -> Props:
        """The `Props` of a shard (arguments as for the class)."""
        return Props(cls, model, rank, shard_count, device)

    @property
    def worker_index(self) -> int:
        """This shard's rank: the `worker_index` its trainer puts on the
        errors it fails a request with."""
        return self.layout.rank

    # -- set-up ---------------------------------------------------------------

    def _build(self) -> None:
        host = self._template.get_params()[self.layout.global_index()]
        be = self.backend
        self.params = be.to_device(np.ascontiguousarray(host, dtype=self.dtype))
        self.grads = be.zeros((self.layout.n_params,), dtype=self.dtype)

    def _w(self, buf: Any, ls: LayerShard) -> Any:
        return buf[ls.w_offset : ls.b_offset].reshape(ls.w_shape)

    def _b(self, buf: Any, ls: LayerShard) -> Any:
        return buf[ls.b_offset : ls.stop]

    def _dev(self, host: np.ndarray) -> Any:
        arr = np.ascontiguousarray(host, dtype=self.dtype)
        return self.backend.to_device(arr) if self.device.is_cuda else arr

    def sum_partials(self, parts: tuple[np.ndarray, ...], width: int, what: str) -> Any:
        """A row-parallel layer's all-reduce (worker thread): the device sum
        of `parts`, one `(batch, width)` partial per shard (`what` names them).

        Raises:
            ValueError: not one array of that shape per shard.
        """
        n = self.layout.shard_count
        if len(parts) != n:
            raise ValueError(
                f"{what}: expected {n} partial arrays (one per shard), got {len(parts)}"
            )
        for p in parts:
            if not isinstance(p, np.ndarray) or p.shape != (self._batch, width):
                raise ValueError(
                    f"{what}: each partial must be an ndarray of shape {(self._batch, width)}, "
                    f"got {getattr(p, 'shape', type(p).__name__)}"
                )
        out = self.backend.empty((self._batch, width), dtype=self.dtype)
        self.backend.sum_into(out, [self._dev(p) for p in parts])
        return out

    # -- phase 1: forward, loss, backward (weights untouched) -------------------

    def _activate(self, u: Any) -> Any:
        """The activation of `u` (`u` itself for "identity")."""
        if self.activation == "identity":
            return u
        out = self.backend.empty(u.shape, dtype=self.dtype)
        self.backend.activation_forward(self.activation, u, out)
        return out

    def _activation_grad(self, pre: Any, d: Any) -> Any:
        """d(loss)/d(pre) from d(loss)/d(activation of pre)."""
        if self.activation == "identity":
            return d
        out = self.backend.empty(d.shape, dtype=self.dtype)
        self.backend.activation_backward(self.activation, pre, d, out)
        return out

    def _check_stage(self, stage: int) -> tuple[LayerShard, ...]:
        if not 0 <= stage < self.layout.stages:
            raise ValueError(f"stage must be in [0, {self.layout.stages}), got {stage}")
        return self.layout.stage_layers(stage)

    def forward_stage(self, stage: int, inputs: tuple[np.ndarray, ...], train: bool) -> np.ndarray:
        """`ShardForward` (worker thread): this shard's part of one stage,
        answered with its output slice or partial sum (host).

        Raises:
            ValueError: a stage out of order or inputs of the wrong shape.
        """
        be = self.backend
        col, *row = self._check_stage(stage)
        pre_input, a_in = self._stage_input(stage, inputs, train, col)
        h = be.empty((self._batch, col.w_shape[1]), dtype=self.dtype)
        be.matmul(a_in, self._w(self.params, col), h)
        be.bias_add(h, self._b(self.params, col))
        tape = _StageTape(pre_input, a_in, h)
        self._tapes[stage] = tape
        if col.gathered:
            return be.to_host(h)
        tape.a = self._activate(h)
        part = be.empty((self._batch, row[0].w_shape[1]), dtype=self.dtype)
        be.matmul(tape.a, self._w(self.params, row[0]), part)
        if row[0].b_size:
            be.bias_add(part, self._b(self.params, row[0]))
        return be.to_host(part)

    def _stage_input(
        self, stage: int, inputs: tuple[np.ndarray, ...], train: bool, col: LayerShard
    ) -> tuple[Any, Any]:
        """`(pre-activation input or None, the column layer's input)` of a stage."""
        if stage == 0:
            return None, self._first_input(inputs, train)
        if self._tapes[stage - 1] is None:
            raise ValueError(f"stage {stage} before stage {stage - 1}")
        u = self.sum_partials(inputs, col.w_shape[0], f"stage {stage} inputs")
        a_in = self._activate(u)
        return (None if a_in is u else u), a_in

    def _first_input(self, inputs: tuple[np.ndarray, ...], train: bool) -> Any:
        """Check stage 0's input and begin a new pass (a training pass commits
        the last apply: it can no longer be rolled back)."""
        sizes = self.layout.sizes
        if len(inputs) != 1 or not isinstance(inputs[0], np.ndarray):
            raise ValueError("stage 0 takes one input array")
        x = inputs[0]
        if x.ndim != 2 or x.shape[1] != sizes[0] or x.shape[0] < 1:
            raise ValueError(f"stage 0 input must be (batch, {sizes[0]}), got {x.shape}")
        self._batch = x.shape[0]
        self._tapes = [None] * self.layout.stages
        self._d_out = None
        if train:
            self._pending = False
            self._undo.commit()
        return self._dev(x)

    def _output(self, outputs: tuple[np.ndarray, ...]) -> Any:
        lay = self.layout
        out_width = lay.sizes[-1]
        if lay.layers[-1].gathered:
            if len(outputs) != lay.shard_count:
                raise ValueError(f"expected {lay.shard_count} output slices, got {len(outputs)}")
            full = np.concatenate([np.asarray(o, dtype=self.dtype) for o in outputs], axis=1)
            if full.shape != (self._batch, out_width):
                raise ValueError(
                    f"output slices make {full.shape}, expected {(self._batch, out_width)}"
                )
            return self._dev(full) if self.device.is_cuda else full
        return self.sum_partials(outputs, out_width, "outputs")

    def compute_loss(
        self, outputs: tuple[np.ndarray, ...], labels: np.ndarray, train: bool
    ) -> LossResult:
        """`ShardLoss` (worker thread): the loss of the combined outputs.

        Raises:
            ValueError: no loss configured, or before the last forward stage.
            InvalidBatchError, NonFiniteError: bad labels, a non-finite loss.
        """
        if self.loss is None:
            raise ValueError("shard has no loss: send ShardConfigure first")
        if self._tapes[-1] is None:
            raise ValueError("ShardLoss before the last forward stage")
        be = self.backend
        out = self._output(outputs)
        y = labels  # validated by the trainer (`validate_batch`)
        grad = be.empty(out.shape, dtype=self.dtype)
        loss_sum, norm = self.loss.sums(be, out, be.to_device(y), grad)
        if train:  # an evaluation's loss is checked where its answer is made (`evaluation`)
            check_loss(loss_sum)
        check_normaliser(norm)
        correct = -1
        if not train and self.loss.is_classification:
            correct = int(np.sum(np.argmax(be.to_host(out), axis=1) == y))
        if train:
            be.scale(grad, 1.0 / norm)
            self._d_out = grad
        return LossResult(float(loss_sum), float(norm), correct)

    def backward_stage(
        self, stage: int, grads: tuple[np.ndarray, ...], input_grad: bool
    ) -> ShardGrad:
        """`ShardBackward` (worker thread): this shard's part of one stage.

        Raises:
            ValueError: before its forward, or gradients of the wrong shape.
        """
        be = self.backend
        col, *row = self._check_stage(stage)
        tape = self._tapes[stage]
        if tape is None:
            raise ValueError(f"backward of stage {stage} before its forward")
        d = self._stage_output_grad(stage, grads, col)
        if row:
            be.matmul(tape.a, d, self._w(self.grads, row[0]), trans_a=True)
            if row[0].b_size:
                be.bias_grad(d, self._b(self.grads, row[0]))
            da = be.empty((self._batch, row[0].w_shape[0]), dtype=self.dtype)
            be.matmul(d, self._w(self.params, row[0]), da, trans_b=True)
            d = self._activation_grad(tape.h, da)
        be.matmul(tape.a_in, d, self._w(self.grads, col), trans_a=True)
        be.bias_grad(d, self._b(self.grads, col))
        partial = None
        if stage > 0 or input_grad:
            dx = be.empty((self._batch, col.w_shape[0]), dtype=self.dtype)
            be.matmul(d, self._w(self.params, col), dx, trans_b=True)
            if tape.pre_input is not None:
                dx = self._activation_grad(tape.pre_input, dx)
            partial = be.to_host(dx)
        sq = float(be.squared_norm(self.grads)) if stage == 0 else None
        return ShardGrad(partial, sq)

    def _stage_output_grad(self, stage: int, grads: tuple[np.ndarray, ...], col: LayerShard) -> Any:
        """d(mean loss)/d(stage output): the loss's on the last stage, else the
        sum of the next stage's partial input gradients."""
        lay = self.layout
        if stage < lay.stages - 1:
            return self.sum_partials(grads, lay.sizes[2 * stage + 2], f"stage {stage} grads")
        if grads:
            raise ValueError("the last stage's backward starts from the loss: grads must be ()")
        if self._d_out is None:
            raise ValueError("backward before a training ShardLoss")
        if not col.gathered:
            return self._d_out
        host = np.asarray(self.backend.to_host(self._d_out))[:, col.lo : col.hi]
        return self.backend.to_device(np.ascontiguousarray(host))

    # -- phase 2: apply out of place, keeping the old state to roll back -------

    def apply_gradients(self, scale: float) -> None:
        """`ShardApply` (worker thread): the optimizer step, out of place (a
        failure changes nothing), the old state kept for `ShardRollback`.

        Raises:
            ValueError: no optimizer configured, or no completed backward.
        """
        opt = self.optimizer
        if opt is None:
            raise ValueError("shard has no optimizer: send ShardConfigure first")
        if self._tapes[0] is None or self._d_out is None:
            raise ValueError("ShardApply without a completed backward")
        self._pending = False
        if scale < 1.0:
            self.backend.scale(self.grads, scale)
        self._undo.apply(self.backend, self, "params", opt, self.grads)  # a failure changes nothing
        self._tapes = [None] * self.layout.stages  # these gradients are spent
        self._d_out = None
        self._pending = True

    def _rollback(self) -> None:
        if not self._pending:
            raise ValueError("nothing to roll back: no ShardApply since the last step began")
        self._undo.rollback()
        self._pending = False

    # -- state ------------------------------------------------------------------

    def _configure(self, optimizer: OptimizerKind, loss: LossKind) -> None:
        if not isinstance(optimizer, OptimizerKind) or not isinstance(loss, LossKind):
            raise TypeError("ShardConfigure needs an OptimizerKind and a LossKind")
        if self.optimizer is None or self.optimizer.kind != optimizer:
            self.optimizer = optimizer.create(self.layout.n_params, self.backend, self.dtype)
        self.loss = loss

    def _gather(self, what: str) -> ShardSlice:
        if what == "params":
            buf = self.params
        elif what == "grads":
            buf = self.grads
        else:
            raise ValueError(f"ShardGather.what must be 'params' or 'grads', got {what!r}")
        return ShardSlice(self.layout.global_index(), np.asarray(self.backend.to_host(buf)))

    def _get_state(self) -> ShardSliceState:
        if self.optimizer is None:
            raise ValueError("shard has no optimizer: send ShardConfigure first")
        return ShardSliceState(
            self.layout.global_index(),
            np.asarray(self.backend.to_host(self.params)),
            self.optimizer.state_dict(),
            self.optimizer.step_count,
        )

    def _set_state(self, params: np.ndarray, optimizer: dict[str, Any], step: int) -> None:
        if self.optimizer is None:
            raise ValueError("shard has no optimizer: send ShardConfigure first")
        total = self.layout.total_params
        flat = np.asarray(params).reshape(-1)
        if flat.shape[0] != total:
            raise CheckpointError(f"{flat.shape[0]} weights for a model of {total} parameters")
        idx = self.layout.global_index()
        sliced = {**slice_state(optimizer, idx, total), "step": int(step)}
        fresh = self.optimizer.kind.create(self.layout.n_params, self.backend, self.dtype)
        try:
            fresh.load_state_dict(sliced)
        except (KeyError, ValueError, TypeError) as exc:
            raise CheckpointError(f"optimizer state does not fit the shard: {exc}") from exc
        host = np.ascontiguousarray(flat[idx], dtype=self.dtype)
        self.backend.copy(self.backend.to_device(host), self.params)
        self.optimizer = fresh
        self._pending = False
        self._undo.commit()
        self._tapes = [None] * self.layout.stages
        self._d_out = None

    def _info(self) -> ShardInfo:
        lay = self.layout
        return ShardInfo(
            rank=lay.rank,
            shard_count=lay.shard_count,
            model=self._template.config(),
            sizes=lay.sizes,
            total_params=lay.total_params,
            n_params=lay.n_params,
            stages=lay.stages,
            in_range=lay.in_range,
            output_range=lay.output_range,
        )

    # -- messages -----------------------------------------------------------------

    def _handler(self, message: Any) -> tuple[Callable[..., Any], tuple[Any, ...]] | None:
        if isinstance(message, ShardForward):
            return self.forward_stage, (message.stage, tuple(message.inputs), bool(message.train))
        if isinstance(message, ShardBackward):
            return self.backward_stage, (
                message.stage,
                tuple(message.grads),
                bool(message.input_grad),
            )
        if isinstance(message, ShardLoss):
            return self.compute_loss, (tuple(message.outputs), message.labels, bool(message.train))
        if isinstance(message, ShardApply):
            return self.apply_gradients, (float(message.scale),)
        if isinstance(message, ShardRollback):
            return self._rollback, ()
        if isinstance(message, ShardGather):
            return self._gather, (message.what,)
        if isinstance(message, ShardGetState):
            return self._get_state, ()
        if isinstance(message, ShardSetState):
            return self._set_state, (message.params, message.optimizer, message.step)
        if isinstance(message, ShardConfigure):
            return self._configure, (message.optimizer, message.loss)
        if isinstance(message, ShardDescribe):
            return self._info, ()
        if isinstance(message, SetLearningRate):
            return self._set_lr, (message.lr,)
        return None

    def _set_lr(self, lr: float) -> None:
        if self.optimizer is None:
            raise RuntimeError("shard not configured: send ShardConfigure first")
        self.optimizer.set_lr(lr)

    async def receive(self, message: Any) -> Any:
        """Answer a `ShardProtocol` message (see the module docstring).

        Returns:
            The message's reply, or `Failure(exc)` for any error (the shard
            keeps its state and is not restarted) and for unknown messages
            (`TypeError`).
        """
        handler = self._handler(message)
        if handler is None:
            return Failure(TypeError(f"ShardActor does not handle {type(message).__name__}"))
        fn, args = handler
        try:
            if self.params is None:
                await self.on_device(self._build)
            result = await self.on_device(guarded, fn, *args)
        except Exception as exc:
            return Failure(exc)
        if isinstance(result, Rejected):
            return Failure(result.error)
        return result
