"""Fault injection for `DataParallelTrainer`: the phases that
tests/train/data_parallel/test_trainer.py does not cover (it covers a device failure
in `_compute`, after the apply, and in a ring chunk).

Here: the replica actor crashing before its forward pass (in `receive`,
not on the device), a device failure mid-backward (gradients half written),
the host all-reduce failing, and the optimizer dying mid-update (weights
half written). In every case: no replica's weights change, the asker gets
the typed error, the failed replica is restarted and re-synced, and
training then ends exactly where an unfaulted run ends. Last, a replica
whose apply outlives the trainer's timeout (it applies after the trainer
gave up on it) is rolled back with the others, and a replica resumed after
raising `OutOfMemory` on a told ring chunk (the chunk is lost) fails the
step at once instead of after the ring's timeout. And a replica failing
while it loads a checkpoint (a `Failure` answer after writing half the new
state, a crash resumed, a crash restarted, an ask timeout): every replica
ends on its state from before the load, and so does the trainer's step count.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atomr import ActorSystem, AskTimeoutError, Props
from atomr.accel import ContextPoisoned, OutOfMemory
from atomr.train import (
    DataParallelTrainer,
    GetWeights,
    LoadCheckpoint,
    LossKind,
    Mlp,
    OptimizerKind,
    SaveCheckpoint,
    Step,
    Trainer,
    TrainerConfig,
    load_checkpoint,
)
from atomr.train.comm.collective import HostCollective
from atomr.train.comm.ring import RingChunk, RingPing
from atomr.train.core.checkpoint import CheckpointError
from atomr.train.data_parallel import DataParallelOptions, GetReplicaWeights, ReplicaActor
from atomr.train.data_parallel.messages import ComputeGradients, GetState, ReplicaState, SetState
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
)

SIZES = [IN, 8, CLASSES]
CONFIG = TrainerConfig(OptimizerKind.sgd(0.1, momentum=0.9), LossKind.CROSS_ENTROPY)


class KnownReplica(ReplicaActor):
    """A replica that tells the test its `ActorRef` (`refs[index]`) when it
    starts, so the test can ask each replica of a trainer directly."""

    def __init__(
        self, model: Mlp, device: str, config: TrainerConfig, refs: dict[int, Any], index: int
    ) -> None:
        super().__init__(model, device, config)
        self.refs, self.index = refs, index

    def pre_start(self) -> Any:
        self.refs[self.index] = self.context.self_ref
        return super().pre_start()


class FaultyReplica(KnownReplica):
    """A replica whose phases fail when its `Plan` says so."""

    def __init__(
        self, model: Mlp, device: str, config: TrainerConfig, refs: dict[int, Any], plan: Plan
    ) -> None:
        super().__init__(model, device, config, refs, 1)
        self.plan = plan

    async def receive(self, message: Any) -> Any:
        """Crash the actor itself (not the device) before the forward pass,
        or on a ring chunk (the supervisor resumes it; the chunk is lost)."""
        if isinstance(message, ComputeGradients):
            self.plan.fire("before_forward", RuntimeError)
        if isinstance(message, RingChunk):
            self.plan.fire("ring_chunk", OutOfMemory)
        if isinstance(message, SetState):
            self.plan.fire("load_resumed", OutOfMemory)  # the supervisor resumes it
            self.plan.fire("load_restarted", RuntimeError)  # the supervisor restarts it
        return await super().receive(message)

    def _set_state(self, state: ReplicaState) -> None:
        """Refuse after writing the new weights, or load after the ask timed out."""
        model = self.model
        assert model is not None
        if self.plan.due("load_refused"):
            model.set_params(state.weights)  # half the new state written ...
            raise CheckpointError("injected failure: load_refused")  # ... then a Failure
        if self.plan.due("load_slow"):
            time.sleep(2.5)  # longer than the trainer's timeout; then it loads
        super()._set_state(state)

    def _compute(self, msg: ComputeGradients) -> Any:
        model = self.model
        assert model is not None
        if self.plan.due("mid_backward"):
            original = model.backward

            def broken(tape: Any, d_out: Any, **kw: Any) -> Any:
                original(tape, d_out, **kw)  # gradients written ...
                model.grads[: model.n_params // 2] = np.nan  # ... then the device dies
                raise ContextPoisoned("injected failure: mid_backward")

            model.backward = broken  # type: ignore[method-assign]
            try:
                return super()._compute(msg)
            finally:
                del model.backward
        return super()._compute(msg)

    def _apply_gradients(self, msg: Any) -> Any:
        opt, model = self.optimizer, self.model
        assert opt is not None and model is not None
        if self.plan.due("slow_apply"):
            time.sleep(2.5)  # longer than the trainer's timeout; then it applies
        if self.plan.due("mid_optimizer"):

            def broken(params: Any, grads: Any, params_out: Any, spare: Any) -> None:
                params_out[: params_out.shape[0] // 2] -= 0.5  # half the update written ...
                raise ContextPoisoned("injected failure: mid_optimizer")

            opt.step_into = broken  # type: ignore[method-assign]
            try:
                return super()._apply_gradients(msg)
            finally:
                del opt.step_into
        return super()._apply_gradients(msg)


PHASES = {
    "before_forward": RuntimeError,
    "mid_backward": ContextPoisoned,
    "all_reduce": ContextPoisoned,
    "mid_optimizer": ContextPoisoned,
}


class Spawned:
    """A trainer over replicas 0 and 2 (plain) and 1 (`FaultyReplica`)."""

    def __init__(self, system: ActorSystem, plan: Plan, collective: str, timeout: float) -> None:
        model = Mlp(SIZES, seed=3)
        self.refs: dict[int, Any] = {}
        props = [
            Props(KnownReplica, model, "cpu:0", CONFIG, self.refs, 0),
            Props(FaultyReplica, model, "cpu:1", CONFIG, self.refs, plan),
            Props(KnownReplica, model, "cpu:2", CONFIG, self.refs, 2),
        ]
        config = dataclasses.replace(CONFIG, worker_timeout=timeout)
        options = DataParallelOptions(collective)
        self.trainer = system.spawn(DataParallelTrainer.props(config, props, options))

    @property
    def replicas(self) -> list[Any]:
        """The replicas' refs, in rank order."""
        return [self.refs[k] for k in range(3)]


def _spawn(system: ActorSystem, plan: Plan, collective: str, timeout: float = T) -> Any:
    return Spawned(system, plan, collective, timeout).trainer


# (the ring all-reduce's own fault is covered by tests/train/data_parallel/test_trainer.py)
@pytest.mark.parametrize(
    ("phase", "collective"),
    [(p, c) for p in PHASES for c in ("host", "ring") if (p, c) != ("all_reduce", "ring")],
)
async def test_a_fault_in_any_phase_changes_nothing_and_training_recovers(
    actor_system: ActorSystem, monkeypatch: pytest.MonkeyPatch, phase: str, collective: str
) -> None:
    plan = Plan()
    if phase == "all_reduce":
        original = HostCollective.all_reduce

        async def flaky(self: HostCollective, *args: Any, **kw: Any) -> Any:
            plan.fire("all_reduce")
            return await original(self, *args, **kw)

        monkeypatch.setattr(HostCollective, "all_reduce", flaky)
    data = batches()
    dp = _spawn(actor_system, plan, collective)

    async def replica_weights() -> list[np.ndarray]:
        return await dp.ask(GetReplicaWeights(), timeout=T)

    error, views = await faulted_run(dp, data, plan, phase, replica_weights)
    assert isinstance(error, PHASES[phase]) and "injected" in str(error), repr(error)
    assert plan.fired == [phase]
    assert_unchanged(views)  # no replica applied anything
    after = await replica_weights()
    for w in after[1:]:  # the restarted replica was re-synced
        np.testing.assert_array_equal(w, after[0])
    clean = _spawn(actor_system, Plan(), collective)
    await clean_run(clean, data)
    accuracy = await assert_same_training(dp, clean)
    print(f"\n{phase}/{collective}: {type(error).__name__}; accuracy after recovery {accuracy:.3f}")


@pytest.mark.parametrize("collective", ["host", "ring"])
async def test_a_replica_applying_after_its_ask_timed_out_is_rolled_back_too(
    actor_system: ActorSystem, collective: str
) -> None:
    data = batches()
    clean = _spawn(actor_system, Plan(), collective)  # first: it also warms up the kernels
    await clean_run(clean, data)
    plan = Plan()
    spawned = Spawned(actor_system, plan, collective, timeout=1.0)
    dp = spawned.trainer

    async def replica_weights() -> list[np.ndarray]:
        # each replica, once it is done
        return [await r.ask(GetWeights(), timeout=T) for r in spawned.replicas]

    error, views = await faulted_run(dp, data, plan, "slow_apply", replica_weights)
    assert isinstance(error, AskTimeoutError), repr(error)
    assert_unchanged(views)
    await assert_same_training(dp, clean)


async def test_a_replica_resumed_after_crashing_on_a_ring_chunk_fails_the_step_at_once(
    actor_system: ActorSystem,
) -> None:
    data = batches()
    reference = await Trainer.spawn(actor_system, Mlp(SIZES, seed=3), "cpu:0", CONFIG)
    plan = Plan()
    spawned = Spawned(actor_system, plan, "ring", timeout=T)  # a lost chunk would wait T
    dp = spawned.trainer

    async def replica_weights() -> list[np.ndarray]:
        return await asyncio.wait_for(dp.ask(GetReplicaWeights()), 5)

    for x, y in data[:FAULT_AT]:
        await asyncio.wait_for(dp.ask(Step(x, y)), 5)
        await asyncio.wait_for(reference.ask(Step(x, y)), 5)
    before = await replica_weights()
    plan.arm("ring_chunk")
    with pytest.raises(OutOfMemory, match="injected"):
        await asyncio.wait_for(dp.ask(Step(*data[FAULT_AT])), 5)
    assert plan.fired == ["ring_chunk"]
    assert_unchanged([before, await replica_weights()])
    for replica in spawned.replicas:  # white-box: nothing left behind
        assert await asyncio.wait_for(replica.ask(RingPing()), 5)  # after the aborts
        cell = replica._cell
        assert cell.instance._ring._inbox == {}
        assert not cell.tasks
    for x, y in data[FAULT_AT + 1 :]:
        await asyncio.wait_for(dp.ask(Step(x, y)), 5)
        await asyncio.wait_for(reference.ask(Step(x, y)), 5)
    await assert_same_training(dp, reference)


LOAD_FAULTS = {
    "load_refused": CheckpointError,
    "load_resumed": OutOfMemory,
    "load_restarted": RuntimeError,
    "load_slow": AskTimeoutError,
}


async def _states(spawned: Spawned) -> list[ReplicaState]:
    """Each replica's own state."""
    return [await asyncio.wait_for(r.ask(GetState()), 5) for r in spawned.replicas]


@pytest.mark.parametrize("collective", ["host", "ring"])
@pytest.mark.parametrize("fault", list(LOAD_FAULTS))
async def test_a_replica_failing_mid_load_leaves_every_replica_as_before_the_load(
    actor_system: ActorSystem, tmp_path: Path, fault: str, collective: str
) -> None:
    data = batches()
    timeout = 1.0 if fault == "load_slow" else T
    clean = _spawn(actor_system, Plan(), collective, timeout)  # first: it warms the kernels
    plan = Plan()
    spawned = Spawned(actor_system, plan, collective, timeout)
    dp = spawned.trainer
    ckpt = tmp_path / "old.ckpt"
    for i, (x, y) in enumerate(data[: FAULT_AT + 2]):
        for trainer in (dp, clean):
            await asyncio.wait_for(trainer.ask(Step(x, y)), 5)
        if i == 0:
            await asyncio.wait_for(dp.ask(SaveCheckpoint(ckpt)), 5)
    before = await _states(spawned)
    plan.arm(fault)
    with pytest.raises(LOAD_FAULTS[fault]) as info:
        await asyncio.wait_for(dp.ask(LoadCheckpoint(ckpt)), 5)
    assert plan.fired == [fault]
    assert getattr(info.value, "worker_index", None) == 1
    assert "replica 1" in "\n".join(getattr(info.value, "__notes__", []))
    after = await _states(spawned)
    assert len(after) == len(before) == 3
    for b, a in zip(before, after, strict=True):  # weights, optimizer state, step count
        assert a.steps == b.steps == FAULT_AT + 2
        np.testing.assert_array_equal(a.weights, b.weights)
        assert_same_optimizer_state(a.optimizer, b.optimizer)
    await asyncio.wait_for(dp.ask(SaveCheckpoint(tmp_path / "after.ckpt")), 5)
    assert load_checkpoint(tmp_path / "after.ckpt").step == FAULT_AT + 2  # the trainer's count
    for x, y in data[FAULT_AT + 2 :]:  # and it trains on as if no load was asked
        for trainer in (dp, clean):
            await asyncio.wait_for(trainer.ask(Step(x, y)), 5)
    await assert_same_training(dp, clean, atol=0.0)
