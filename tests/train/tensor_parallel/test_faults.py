"""Fault injection for `TensorParallelTrainer`: the phases that
tests/train/tensor_parallel/test_trainer.py does not cover (it covers a device
failure in `_backward` and after a full `_apply`).

Here: a device failure before the forward pass, in the loss (the point
where the shards' outputs are combined), in the partial-sum all-reduce of
a row-parallel layer (`_combine_sum`), and mid-optimizer with half the
slice written; and the shard actor itself crashing (not its device), which
the trainer resumes (its state is intact). Each time no shard's slice
changes, the asker gets the typed error, and training ends where an
unfaulted run ends. Last, a shard actor raising `ContextPoisoned` is
restarted and has lost its slice: the trainer refuses with `WorkerStateLost`
until a checkpoint is loaded. And a shard whose `ShardApply` outlives the
trainer's ask timeout (it applies after the trainer gave up) is rolled back
with the others. Last, a shard crashing while it loads a checkpoint: every
shard keeps (gets back) its state from before the load.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atomr import ActorSystem, AskTimeoutError
from atomr.accel import ContextPoisoned, cpu_devices
from atomr.train import (
    LoadCheckpoint,
    LossKind,
    Mlp,
    OptimizerKind,
    SaveCheckpoint,
    Step,
    TensorParallelTrainer,
    Trainer,
    TrainerConfig,
)
from atomr.train.tensor_parallel import ShardActor
from atomr.train.tensor_parallel.messages import (
    ShardForward,
    ShardGather,
    ShardGetState,
    ShardSetState,
    ShardSliceState,
)
from tests.reliability.faults import (
    CLASSES,
    FAULT_AT,
    IN,
    Plan,
    T,
    assert_same_optimizer_state,
    assert_same_training,
    assert_unchanged,
    batches,
    clean_run,
    faulted_run,
    lost_until_reloaded,
)

SIZES = [IN, 8, 8, CLASSES]
FAULTY_RANK = 1
CONFIG = TrainerConfig(OptimizerKind.adam(0.05), LossKind.CROSS_ENTROPY)


def _install(monkeypatch: pytest.MonkeyPatch, plan: Plan) -> None:
    """Hook the built-in shard's device-side methods on rank `FAULTY_RANK`."""

    def wrap(name: str, phase: str) -> None:
        original = getattr(ShardActor, name)

        def hooked(self: ShardActor, *args: Any) -> Any:
            if self.layout.rank == FAULTY_RANK:
                plan.fire(phase)
            return original(self, *args)

        monkeypatch.setattr(ShardActor, name, hooked)

    wrap("_forward", "before_forward")
    wrap("_loss", "loss")
    wrap("_combine_sum", "all_reduce")
    original_apply = ShardActor._apply

    def apply(self: ShardActor, scale: float) -> None:
        opt = self.optimizer
        if self.layout.rank != FAULTY_RANK or not plan.due("mid_optimizer") or opt is None:
            return original_apply(self, scale)

        def broken(params: Any, grads: Any, params_out: Any, spare: Any) -> None:
            params_out[: params_out.shape[0] // 2] -= 0.5
            raise ContextPoisoned("injected failure: mid_optimizer")

        opt.step_into = broken  # type: ignore[method-assign]
        try:
            return original_apply(self, scale)
        finally:
            del opt.step_into

    monkeypatch.setattr(ShardActor, "_apply", apply)
    original_receive = ShardActor.receive

    async def receive(self: ShardActor, message: Any) -> Any:
        if isinstance(message, ShardForward) and self.layout.rank == FAULTY_RANK:
            plan.fire("actor_crash", RuntimeError)  # raised in the actor, not answered
            plan.fire("context_poisoned")  # the same, as a lost device context
        if isinstance(message, ShardSetState) and self.layout.rank == FAULTY_RANK:
            plan.fire("load_crash", RuntimeError)  # the other shard loads meanwhile
        return await original_receive(self, message)

    monkeypatch.setattr(ShardActor, "receive", receive)


async def _spawn(system: ActorSystem) -> Any:
    return await TensorParallelTrainer.spawn(
        system, Mlp(SIZES, activation="tanh", seed=4), cpu_devices(2), CONFIG
    )


async def _slices(tp: Any) -> list[np.ndarray]:
    shards = tp._cell.instance._shards  # white-box: ask each shard for its own slice
    return [(await s.ask(ShardGather("params"), timeout=T)).values for s in shards]


@pytest.mark.parametrize("phase", ["before_forward", "loss", "all_reduce", "mid_optimizer"])
async def test_a_device_fault_in_any_phase_changes_no_shard(
    actor_system: ActorSystem, monkeypatch: pytest.MonkeyPatch, phase: str
) -> None:
    plan = Plan()
    _install(monkeypatch, plan)
    data = batches()
    tp = await _spawn(actor_system)
    error, views = await faulted_run(tp, data, plan, phase, lambda: _slices(tp))
    assert isinstance(error, ContextPoisoned) and "injected" in str(error), repr(error)
    assert plan.fired == [phase]
    assert_unchanged(views)
    clean = await _spawn(actor_system)
    await clean_run(clean, data)
    accuracy = await assert_same_training(tp, clean)
    print(f"\n{phase}: {type(error).__name__}; accuracy after recovery {accuracy:.3f}")


async def test_a_crashed_shard_actor_is_resumed_and_training_continues(
    actor_system: ActorSystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = Plan()
    _install(monkeypatch, plan)
    data = batches()
    tp = await _spawn(actor_system)
    error, views = await faulted_run(tp, data, plan, "actor_crash", lambda: _slices(tp))
    assert isinstance(error, RuntimeError) and "injected" in str(error), repr(error)
    assert_unchanged(views)
    clean = await _spawn(actor_system)
    await clean_run(clean, data)
    await assert_same_training(tp, clean)


async def test_a_poisoned_shard_context_refuses_until_a_checkpoint_is_loaded(
    actor_system: ActorSystem, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    plan = Plan()
    _install(monkeypatch, plan)
    tp = await _spawn(actor_system)
    model = Mlp(SIZES, activation="tanh", seed=4)
    single = await Trainer.spawn(actor_system, model, "cpu:0", CONFIG)
    await lost_until_reloaded(
        tp, single, batches(), plan, "context_poisoned", "shard", FAULTY_RANK, tmp_path
    )


async def test_a_shard_applying_after_the_ask_timed_out_is_rolled_back_too(
    actor_system: ActorSystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow = Plan()
    original_apply = ShardActor._apply

    def apply(self: ShardActor, scale: float) -> None:
        if self.layout.rank == FAULTY_RANK and slow.due("slow_apply"):
            time.sleep(2.5)  # longer than the trainer's ask timeout; then it applies
        return original_apply(self, scale)

    monkeypatch.setattr(ShardActor, "_apply", apply)
    data = batches()
    clean = await _spawn(actor_system)  # first: it also warms up the kernels
    await clean_run(clean, data)
    config = dataclasses.replace(CONFIG, worker_timeout=1.0)
    model = Mlp(SIZES, activation="tanh", seed=4)
    tp = await TensorParallelTrainer.spawn(actor_system, model, cpu_devices(2), config)
    error, views = await faulted_run(
        tp, data[: FAULT_AT + 1], slow, "slow_apply", lambda: _slices(tp)
    )
    assert isinstance(error, AskTimeoutError), repr(error)
    assert_unchanged(views)  # asked after the slow apply: each shard's settled slice
    shards = tp._cell.instance._shards
    states = await asyncio.wait_for(asyncio.gather(*(s.ask(ShardGetState()) for s in shards)), 5)
    assert [s.step for s in states] == [FAULT_AT, FAULT_AT]
    for x, y in data[FAULT_AT + 1 :]:
        await asyncio.wait_for(tp.ask(Step(x, y)), 5)
    await assert_same_training(tp, clean)


async def _states(tp: Any) -> list[ShardSliceState]:
    shards = tp._cell.instance._shards  # white-box: each shard's own state
    return list(
        await asyncio.wait_for(asyncio.gather(*(s.ask(ShardGetState()) for s in shards)), 5)
    )


async def test_a_shard_crashing_mid_load_leaves_every_shard_as_before_the_load(
    actor_system: ActorSystem, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    plan = Plan()
    _install(monkeypatch, plan)
    data = batches()
    tp = await _spawn(actor_system)
    clean = await _spawn(actor_system)
    ckpt = tmp_path / "old.ckpt"
    for i, (x, y) in enumerate(data[: FAULT_AT + 2]):
        for trainer in (tp, clean):
            await asyncio.wait_for(trainer.ask(Step(x, y)), 5)
        if i == 0:
            await asyncio.wait_for(tp.ask(SaveCheckpoint(ckpt)), 5)
    before = await _states(tp)
    plan.arm("load_crash")
    with pytest.raises(RuntimeError, match="injected") as info:
        await asyncio.wait_for(tp.ask(LoadCheckpoint(ckpt)), 5)
    assert plan.fired == ["load_crash"]
    after = await _states(tp)
    for b, a in zip(before, after, strict=True):  # weights, optimizer state, step count
        assert a.step == b.step == FAULT_AT + 2
        np.testing.assert_array_equal(a.params, b.params)
        assert_same_optimizer_state(a.optimizer, b.optimizer)
    assert tp._cell.instance.steps == FAULT_AT + 2  # white-box: the trainer's count too
    assert getattr(info.value, "worker_index", None) == FAULTY_RANK
    assert f"shard {FAULTY_RANK}" in "\n".join(getattr(info.value, "__notes__", []))
    for x, y in data[FAULT_AT + 2 :]:  # and it trains on as if no load was asked
        for trainer in (tp, clean):
            await asyncio.wait_for(trainer.ask(Step(x, y)), 5)
    await assert_same_training(tp, clean, atol=0.0)
