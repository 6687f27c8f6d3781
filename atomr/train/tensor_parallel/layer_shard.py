"""`LayerShardActor`: one tensor-parallel shard of any `Sequential`, on one device.

It holds its part of every layer (`ShardPlan.local_model`) and the optimizer
state of that part. A `ShardPass` runs the whole model forward and backward
on the shard's device thread; the layers meet the other shards mid-pass in
the trainer's `ThreadGroup`. If the pass fails here, the shard aborts the
group so that the others stop waiting at once. Updates are atomic
(`DoubleBuffer`): `ShardApply` writes them out of place, `ShardCommit`
keeps and `ShardRollback` undoes them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from atomr.accel import Device, DeviceActor
from atomr.actor import Failure
from atomr.train._recovery import DoubleBuffer
from atomr.train.core._step_checks import check_loss, check_normaliser
from atomr.train.core.checkpoint import restored_optimizer
from atomr.train.core.config import TrainerConfig
from atomr.train.core.device_guard import REQUEST_ERRORS, Rejected, guarded
from atomr.train.core.messages import SetLearningRate
from atomr.train.core.model.layer import ForwardContext
from atomr.train.core.model.sequential import Sequential
from atomr.train.core.optimizer_state import Optimizer
from atomr.train.tensor_parallel._layer_rules import Meeting
from atomr.train.tensor_parallel._thread_group import GroupBroken, ThreadGroup
from atomr.train.tensor_parallel.layer_messages import (
    LayerShardState,
    PassResult,
    ShardApply,
    ShardCommit,
    ShardPass,
    ShardRollback,
    ShardStateGet,
    ShardStateSet,
)
from atomr.train.tensor_parallel.shard_plan import ShardPlan

__all__ = ["LayerShardActor"]


class LayerShardActor(DeviceActor):
    """Shard `rank` of a model split by `plan` (module docstring).

    Args:
        plan: the model's plan (the whole model's initial weights in it).
        rank: this shard's index.
        group: where the shards meet mid-pass.
        device: a `Device` or its name.
        config: optimizer and loss.
    """

    def __init__(
        self,
        plan: ShardPlan,
        rank: int,
        group: ThreadGroup,
        device: Device | str,
        config: TrainerConfig,
    ) -> None:
        super().__init__(device)
        self.plan, self.rank, self.group, self.config = plan, rank, group, config
        self.model: Sequential | None = None
        self.optimizer: Optimizer | None = None
        self.steps = 0
        self._undo = DoubleBuffer()
        self._token = 0
        # the gradient ranges this shard counts in the norm (the replicated
        # parameters only on shard 0)
        self._owned: list[tuple[int, int]] = []

    @property
    def worker_index(self) -> int:
        """This shard's rank (`atomr.testkit.inject_faults(worker=k)`)."""
        return self.rank

    def _build(self) -> None:
        model = self.plan.local_model(self.rank, Meeting(self.group, self.rank), self.device)
        model.set_params(self.plan.split(self.plan.model.get_params())[self.rank])
        self.optimizer = self.config.optimizer.create(model.n_params, model.backend, model.dtype)
        mask = self.plan.replicated_mask(self.rank)
        self._owned = _runs(np.ones_like(mask) if self.rank == 0 else ~mask)
        self.model = model

    async def receive(self, message: Any) -> Any:
        """Answer a message of `layer_messages` (or `SetLearningRate`) on the
        device thread; `OnDevice` as every `DeviceActor` does (the trainer's
        fence)."""
        if self.model is None:
            await self.on_device(self._build)
        handler = {
            ShardPass: self.run_pass,
            ShardApply: self.apply,
            ShardCommit: lambda m: self._commit(m.token),
            ShardRollback: lambda m: self._rollback(m.token),
            ShardStateGet: lambda _: self._state(),
            ShardStateSet: lambda m: self._set_state(m.state),
            SetLearningRate: lambda m: self.optimizer.set_lr(m.lr),  # type: ignore[union-attr]
        }.get(type(message))
        if handler is None:
            return await super().receive(message)
        try:
            # a pass another shard broke is answered, not a failure of this actor
            errors = (*REQUEST_ERRORS, GroupBroken)
            result = await self.on_device(guarded, self._aborting, handler, message, errors=errors)
        except REQUEST_ERRORS as exc:
            return Failure(exc)
        return Failure(result.error) if isinstance(result, Rejected) else result

    def _aborting(self, handler: Any, message: Any) -> Any:
        """Run `handler`; on any failure wake the other shards first."""
        try:
            return handler(message)
        except BaseException:
            self.group.abort()
            raise

    def run_pass(self, msg: ShardPass) -> PassResult:
        """Forward, loss and (training) backward of the whole batch (worker thread).

        Raises:
            NonFiniteError, ValueError: a non-finite loss or a zero normaliser.
            GroupBroken: another shard failed mid-pass.
        """
        model = self.model
        assert model is not None
        be = model.backend
        x = be.to_device(msg.features)
        ctx = ForwardContext(msg.train, msg.step, 0)
        tape = model.forward_train(x, ctx) if msg.train else None
        out = tape.output if tape is not None else model.forward(x, ctx)
        d_out = be.empty(out.shape, dtype=model.dtype)
        loss_sum, norm = self.config.loss.sums(be, out, be.to_device(msg.labels), d_out)
        correct = 0
        if self.config.loss.is_classification:
            correct = int(np.sum(np.argmax(be.to_host(out), axis=-1) == msg.labels))
        squared = 0.0
        if tape is not None:
            check_loss(loss_sum)
            check_normaliser(norm)
            be.scale(d_out, 1.0 / norm)
            model.backward(tape, d_out)
            grads = model.grads
            squared = sum(be.squared_norm_unchecked(grads[lo:hi]) for lo, hi in self._owned)
        return PassResult(float(loss_sum), float(norm), correct, squared)

    def apply(self, msg: ShardApply) -> None:
        """The optimizer step by the clipped gradient, out of place and pending."""
        model, opt = self.model, self.optimizer
        assert model is not None and opt is not None
        if msg.coefficient < 1.0:
            model.backend.scale(model.grads, msg.coefficient)
        self._undo.apply(model.backend, model, "params", opt, model.grads)
        self._token = msg.token

    def _commit(self, token: int) -> None:
        if self._undo.pending and self._token == token:
            self._undo.commit()
            self.steps += 1

    def _rollback(self, token: int) -> bool:
        if not self._undo.pending or self._token != token:
            return False
        self._undo.rollback()
        return True

    def _state(self) -> LayerShardState:
        model, opt = self.model, self.optimizer
        assert model is not None and opt is not None
        return LayerShardState(model.get_params(), opt.state_dict(), self.steps)

    def _set_state(self, state: LayerShardState) -> None:
        model = self.model
        assert model is not None
        kind, n = self.config.optimizer, model.n_params
        fresh = (
            restored_optimizer(
                kind, n, state.optimizer, model.backend, model.dtype, f"shard {self.rank}"
            )
            if state.optimizer
            else kind.create(n, model.backend, model.dtype)
        )
        model.set_params(state.params)
        self.optimizer = fresh
        self.steps = int(state.steps)
        self._undo = DoubleBuffer()


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """The `(start, stop)` of every run of True in a 1-D boolean mask."""
    edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.astype(np.int8), [0]))))
    return [(int(lo), int(hi)) for lo, hi in zip(edges[::2], edges[1::2], strict=True)]
