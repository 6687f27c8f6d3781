"""Fault injection for `TensorParallelTrainer`: the phases that
tests/train/tensor_parallel/test_trainer.py does not cover (it covers a device
failure in `backward_stage` and after a full `apply_gradients`).

Here: a device failure before the forward pass, in the loss (the point
where the shards' outputs are combined), in the partial-sum all-reduce of
a row-parallel layer (`sum_partials`), and mid-optimizer with half the
slice written; and the shard actor itself crashing (not its device), which
the trainer resumes (its state is intact). Each time no shard's slice
changes, the asker gets the typed error, and training ends where an
unfaulted run ends. Last, a shard actor raising `ContextPoisoned` is
restarted and has lost its slice: the trainer refuses with `WorkerStateLost`
until a checkpoint is loaded. And a shard whose `ShardApply` outlives the
trainer's ask timeout (it applies after the trainer gave up) is rolled back
with the others. Last, a shard crashing while it loads a checkpoint: every
shard keeps (gets back) its state from before the load.

The faults go in through public seams: `atomr.testkit.inject_faults` on the
shard's hooks and messages, a `shard_class` that tells the test its ref.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atomr import ActorRef, ActorSystem, AskTimeoutError
from atomr.accel import ContextPoisoned, cpu_devices
from atomr.testkit import Plan, inject_faults
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
    load_checkpoint,
)
from atomr.train.tensor_parallel import ShardActor, TensorParallelOptions
from atomr.train.tensor_parallel.messages import (
    ShardApply,
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
    T,
    assert_a_late_read_is_not_trained,
    assert_same_optimizer_state,
    assert_same_training,
    assert_unchanged,
    batches,
    clean_run,
    dying_optimizer,
    faulted_run,
    lost_until_reloaded,
    noting,
)

SIZES = [IN, 8, 8, CLASSES]
FAULTY_RANK = 1
CONFIG = TrainerConfig(OptimizerKind.adam(0.05), LossKind.CROSS_ENTROPY)
SLOW = 2.5
"""Seconds the slow shard stalls in its apply: the injected fault, longer
than the 1 s timeout its trainer is given."""

PLACES: dict[str, str | type] = {
    "before_forward": "forward_stage",  # a device failure before the forward
    "loss": "compute_loss",  # where the shards' outputs are combined
    "all_reduce": "sum_partials",  # a row-parallel layer's partial sums
    "slow_apply": "apply_gradients",  # applies after the trainer's ask timed out
    "actor_crash": ShardForward,  # raised in the actor, not answered (resumed)
    "context_poisoned": ShardForward,  # the same, as a lost device context (restarted)
    "load_crash": ShardSetState,  # the other shard loads meanwhile
    "apply_crash": ShardApply,  # armed `after`: applied, then the actor raises
}
"""Where shard `FAULTY_RANK`'s phases fail (`inject_faults`); "mid_optimizer"
writes half the update first (`dying_optimizer`)."""


class Spawned:
    """A trainer whose shards fail where `plan` says (shard `FAULTY_RANK`)
    and tell the test their refs, so it can ask each for its own state."""

    def __init__(self, plan: Plan) -> None:
        self.refs: dict[int, ActorRef] = {}
        refs = self.refs

        class KnownShard(ShardActor):
            def pre_start(self) -> Any:
                refs[self.worker_index] = self.context.self_ref
                return super().pre_start()

        faulty = inject_faults(KnownShard, plan, PLACES, worker=FAULTY_RANK)
        self.options = TensorParallelOptions(
            shard_class=dying_optimizer(faulty, plan, worker=FAULTY_RANK)
        )
        self.trainer: Any = None

    async def spawn(self, system: ActorSystem, config: TrainerConfig = CONFIG) -> Any:
        """Spawn the trainer; returns its ref."""
        model = Mlp(SIZES, activation="tanh", seed=4)
        self.trainer = await TensorParallelTrainer.spawn(
            system, model, cpu_devices(2), config, self.options
        )
        return self.trainer

    async def slices(self) -> list[np.ndarray]:
        """Each shard's own slice of the weights (once it is done)."""
        refs = [self.refs[r] for r in sorted(self.refs)]
        return [(await s.ask(ShardGather("params"), timeout=T)).values for s in refs]

    async def states(self) -> list[ShardSliceState]:
        """Each shard's own state: its slice, optimizer state and step count."""
        refs = [self.refs[r] for r in sorted(self.refs)]
        return list(await asyncio.gather(*(s.ask(ShardGetState(), timeout=T) for s in refs)))


async def _spawn(system: ActorSystem, plan: Plan | None = None) -> Any:
    return await Spawned(plan or Plan()).spawn(system)


@pytest.mark.parametrize("phase", ["before_forward", "loss", "all_reduce", "mid_optimizer"])
async def test_a_device_fault_in_any_phase_changes_no_shard(
    actor_system: ActorSystem, phase: str
) -> None:
    plan = Plan()
    data = batches()
    spawned = Spawned(plan)
    tp = await spawned.spawn(actor_system)
    error, views = await faulted_run(tp, data, plan, phase, spawned.slices)
    assert isinstance(error, ContextPoisoned) and "injected" in str(error), repr(error)
    assert plan.fired == [phase]
    assert_unchanged(views)
    clean = await _spawn(actor_system)
    await clean_run(clean, data)
    accuracy = await assert_same_training(tp, clean)
    print(f"\n{phase}: {type(error).__name__}; accuracy after recovery {accuracy:.3f}")


async def test_a_crashed_shard_actor_is_resumed_and_training_continues(
    actor_system: ActorSystem,
) -> None:
    plan = Plan()
    data = batches()
    spawned = Spawned(plan)
    tp = await spawned.spawn(actor_system)
    error, views = await faulted_run(tp, data, plan, "actor_crash", spawned.slices, RuntimeError)
    assert isinstance(error, RuntimeError) and "injected" in str(error), repr(error)
    assert_unchanged(views)
    clean = await _spawn(actor_system)
    await clean_run(clean, data)
    await assert_same_training(tp, clean)


async def test_a_shard_actor_crashing_after_its_apply_is_rolled_back_too(
    actor_system: ActorSystem,
) -> None:
    """Shard 1 applies its update, then its actor raises instead of replying:
    the step failed, so shard 1 must roll back with the others."""
    plan = Plan()
    data = batches()
    spawned = Spawned(plan)
    tp = await spawned.spawn(actor_system)
    error, views = await faulted_run(
        tp, data, plan, "apply_crash", spawned.slices, RuntimeError, after=True
    )
    assert isinstance(error, RuntimeError) and "injected" in str(error), repr(error)
    assert plan.fired == ["apply_crash"]
    assert_unchanged(views)
    clean = await _spawn(actor_system)
    await clean_run(clean, data)
    await assert_same_training(tp, clean)


async def test_a_poisoned_shard_context_refuses_until_a_checkpoint_is_loaded(
    actor_system: ActorSystem, tmp_path: Path
) -> None:
    plan = Plan()
    tp = await _spawn(actor_system, plan)
    model = Mlp(SIZES, activation="tanh", seed=4)
    single = await Trainer.spawn(actor_system, model, "cpu:0", CONFIG)
    await lost_until_reloaded(
        tp, single, batches(), plan, "context_poisoned", "shard", FAULTY_RANK, tmp_path
    )


async def test_a_shard_applying_after_the_ask_timed_out_is_rolled_back_too(
    actor_system: ActorSystem,
) -> None:
    data = batches()
    clean = await _spawn(actor_system)  # first: it also warms up the kernels
    await clean_run(clean, data)
    slow = Plan()
    spawned = Spawned(slow)
    tp = await spawned.spawn(actor_system, dataclasses.replace(CONFIG, worker_timeout=1.0))
    error, views = await faulted_run(
        tp, data[: FAULT_AT + 1], slow, "slow_apply", spawned.slices, None, delay=SLOW
    )
    assert isinstance(error, AskTimeoutError), repr(error)
    assert_unchanged(views)  # asked after the slow apply: each shard's settled slice
    assert [s.step for s in await spawned.states()] == [FAULT_AT, FAULT_AT]
    for x, y in data[FAULT_AT + 1 :]:
        await asyncio.wait_for(tp.ask(Step(x, y)), 5)
    await assert_same_training(tp, clean)


async def test_a_shard_crashing_mid_load_leaves_every_shard_as_before_the_load(
    actor_system: ActorSystem, tmp_path: Path
) -> None:
    plan = Plan()
    data = batches()
    spawned = Spawned(plan)
    tp = await spawned.spawn(actor_system)
    clean = await _spawn(actor_system)
    ckpt = tmp_path / "old.ckpt"
    for i, (x, y) in enumerate(data[: FAULT_AT + 2]):
        for trainer in (tp, clean):
            await asyncio.wait_for(trainer.ask(Step(x, y)), 5)
        if i == 0:
            await asyncio.wait_for(tp.ask(SaveCheckpoint(ckpt)), 5)
    before = await spawned.states()
    plan.arm("load_crash", RuntimeError)
    with pytest.raises(RuntimeError, match="injected") as info:
        await asyncio.wait_for(tp.ask(LoadCheckpoint(ckpt)), 5)
    assert plan.fired == ["load_crash"]
    after = await spawned.states()
    assert len(after) == len(before) == 2
    for b, a in zip(before, after, strict=True):  # weights, optimizer state, step count
        assert a.step == b.step == FAULT_AT + 2
        np.testing.assert_array_equal(a.params, b.params)
        assert_same_optimizer_state(a.optimizer, b.optimizer)
    await asyncio.wait_for(tp.ask(SaveCheckpoint(tmp_path / "after.ckpt")), 5)
    assert load_checkpoint(tmp_path / "after.ckpt").step == FAULT_AT + 2  # the trainer's count
    assert getattr(info.value, "worker_index", None) == FAULTY_RANK
    assert f"shard {FAULTY_RANK}" in "\n".join(getattr(info.value, "__notes__", []))
    for x, y in data[FAULT_AT + 2 :]:  # and it trains on as if no load was asked
        for trainer in (tp, clean):
            await asyncio.wait_for(trainer.ask(Step(x, y)), 5)
    await assert_same_training(tp, clean, atol=0.0)


async def test_a_batch_refilled_after_its_timed_out_step_answers_is_not_trained() -> None:
    """The shards get views of the `Step`'s features (a shard of the whole
    input width). A shard held past `worker_timeout` on its first forward
    reads them after the `Step` answered `AskTimeoutError` and the sender
    refilled them, but what it computes is never applied (the apply is sent
    only once every shard answered the pass, and the next pass overwrites
    it), so no copy is needed."""
    plan, notes = Plan(), list[Any]()
    shard = inject_faults(
        noting(ShardActor, ShardForward, 1, notes), plan, {"held": ShardForward}, worker=1
    )
    options = TensorParallelOptions(shard_class=shard)

    async def spawn(system: ActorSystem, config: TrainerConfig) -> ActorRef:
        model = Mlp([IN, 8, CLASSES], seed=2)
        return await TensorParallelTrainer.spawn(system, model, cpu_devices(2), config, options)

    await assert_a_late_read_is_not_trained(spawn, plan, notes, batches(3))
