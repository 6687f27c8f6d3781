"""`ShardActor`: the built-in tensor-parallel shard, one slice of an `Mlp`
on one device.

It answers `ShardProtocol` (`atomr.train.tensor_parallel.messages`) with the
Megatron-LM column/row split of `atomr.train.tensor_parallel.sharding`. The
math of a step's first phase (forward, loss, backward) is `ShardMath`'s
(`_shard_math.py`); here are the update, the state and the messages.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from atomr.accel import Device
from atomr.actor import Failure, Props, not_handled
from atomr.train._recovery import DoubleBuffer
from atomr.train.core.checkpoint import restored_optimizer
from atomr.train.core.device_guard import Rejected, guarded
from atomr.train.core.errors import CheckpointError
from atomr.train.core.loss import LossKind
from atomr.train.core.messages import SetLearningRate
from atomr.train.core.mlp import Mlp
from atomr.train.core.optimizer import OptimizerKind
from atomr.train.core.optimizer_state import Optimizer
from atomr.train.tensor_parallel._shard_math import ShardMath, StageTape
from atomr.train.tensor_parallel.messages import (
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
from atomr.train.tensor_parallel.sharding import ShardLayout, shard_layout, slice_state

__all__ = ["ShardActor"]

# Errors that reject a request (`device_guard.guarded` catches them on the
# worker thread); unlike the Trainer's, an OSError is a device failure here.


class ShardActor(ShardMath):
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
        self._tapes: list[StageTape | None] = [None] * self.layout.stages
        self._batch = 0
        self._d_out: Any = None
        self._undo = DoubleBuffer()
        self._pending = False
        # an unconfirmed update (`ShardBackward.apply`): the tapes and output
        # gradient it spent, given back should it be undone
        self._unconfirmed: tuple[list[StageTape | None], Any] | None = None

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

    # -- phase 2: apply out of place, keeping the old state to roll back -------

    def apply_gradients(self, scale: float) -> None:
        """`ShardApply`, or the end of a `ShardBackward(apply=True)` (worker
        thread): the optimizer step, out of place (a failure changes
        nothing), the old state kept for `ShardRollback`.

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
        spent, self._unconfirmed = self._unconfirmed, None
        if spent is not None:  # its gradients are not spent after all
            self._tapes, self._d_out = spent

    def _backward(self, message: ShardBackward) -> ShardGrad:
        """`ShardBackward` (worker thread): `backward_stage`, then with `apply`
        the unconfirmed update (see `ShardBackward`).

        Raises:
            ValueError: `apply` at a stage other than 0, or as the hooks raise.
        """
        stage, apply = message.stage, bool(message.apply)
        if apply and stage != 0:
            raise ValueError(f"ShardBackward.apply is for stage 0, not stage {stage}")
        reply = self.backward_stage(stage, tuple(message.grads), bool(message.input_grad))
        if apply and reply.sq_norm is not None and math.isfinite(reply.sq_norm):
            self._unconfirmed = (self._tapes, self._d_out)
            try:
                self.apply_gradients(1.0)
            finally:
                if not self._pending:  # nothing was swapped in
                    self._unconfirmed = None
        return reply

    def _loss_and_backward(self, message: ShardLoss) -> ShardGrad:
        """`ShardLoss` with `backward` (worker thread): `compute_loss`, then
        that backward (`_backward`); its `ShardGrad` carries the `LossResult`.

        Raises:
            TypeError: `backward` is not a `ShardBackward`.
            ValueError: not `train`, `backward` not of the last stage, or as
                the hooks raise.
        """
        backward = message.backward
        if not isinstance(backward, ShardBackward):
            raise TypeError(
                f"ShardLoss.backward must be a ShardBackward, got {type(backward).__name__}"
            )
        last = self.layout.stages - 1
        if not message.train or backward.stage != last:
            raise ValueError(f"ShardLoss.backward is a training loss's stage {last} backward")
        result = self.compute_loss(tuple(message.outputs), message.labels, True)
        return dataclasses.replace(self._backward(backward), loss=result)

    def _undoing(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Undo the unconfirmed update (the step it belonged to failed), then `fn(*args)`."""
        self._rollback()
        return fn(*args)

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
        fresh = restored_optimizer(
            self.optimizer.kind,
            self.layout.n_params,
            sliced,
            self.backend,
            self.dtype,
            f"shard {self.layout.rank}",
        )
        host = np.ascontiguousarray(flat[idx], dtype=self.dtype)
        self.backend.upload(host, self.params)
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
            return self._backward, (message,)
        if isinstance(message, ShardLoss):
            if message.backward is not None:
                return self._loss_and_backward, (message,)
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

    def _set_lr(self, lr: float) -> float:
        if self.optimizer is None:
            raise RuntimeError("shard not configured: send ShardConfigure first")
        return self.optimizer.set_lr(lr)

    async def receive(self, message: Any) -> Any:
        """Answer a `ShardProtocol` message (see the module docstring).

        Returns:
            The message's reply, or `Failure(exc)` for any error (the shard
            keeps its state and is not restarted) and for unknown messages
            (`TypeError`).
        """
        handler = self._handler(message)
        if handler is None:
            return not_handled("ShardActor", message)
        fn, args = handler
        if self._unconfirmed is not None:
            if isinstance(message, ShardApply) and args[0] >= 1.0:
                self._unconfirmed = None  # confirmed: the update is in place already
                return None
            if not isinstance(message, ShardRollback):
                fn, args = self._undoing, (fn, *args)
        try:
            if self.params is None:
                await self.on_device(self._build)
            result = await self.on_device(guarded, fn, *args)
        except Exception as exc:
            return Failure(exc)
        if isinstance(result, Rejected):
            return Failure(result.error)
        return result
