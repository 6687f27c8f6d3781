"""Fault injection for `DataParallelTrainer`: the phases that
tests/train/data_parallel/test_trainer.py does not cover (it covers a device failure
in `compute_gradients`, after the apply, and in a ring chunk).

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
while it loads a checkpoint (a `Failure` answer after writing the new
state, a crash resumed, a crash restarted, an ask timeout): every replica
ends on its state from before the load, and so does the trainer's step count.

The faults go in through public seams: `atomr.testkit.inject_faults` on the
replica's hooks and messages and on the host collective given in the options.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atomr import ActorRef, ActorSystem, AskTimeoutError, Props
from atomr.accel import ContextPoisoned, OutOfMemory
from atomr.testkit import Plan, inject_faults
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
from atomr.train.comm.collective import Collective, HostCollective
from atomr.train.comm.ring import RingChunk, RingPing
from atomr.train.core.checkpoint import CheckpointError
from atomr.train.data_parallel import (
    DataParallelOptions,
    GetReplicaWeights,
    ReplicaActor,
    SyncParams,
)
from atomr.train.data_parallel.messages import ComputeGradients, GetState, ReplicaState, SetState
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
    noting,
)

SIZES = [IN, 8, CLASSES]
CONFIG = TrainerConfig(OptimizerKind.sgd(0.1, momentum=0.9), LossKind.CROSS_ENTROPY)
SLOW = 2.5
"""Seconds a slow replica stalls: the injected fault, longer than the 1 s
timeout the trainer is given in those tests."""


class KnownReplica(ReplicaActor):
    """A replica that tells the test its `ActorRef` (`refs[index]`) when it
    starts, so the test can ask each replica of a trainer directly."""

    def __init__(
        self, model: Mlp, device: str, config: TrainerConfig, refs: dict[int, Any], index: int
    ) -> None:
        super().__init__(model, device, config, index)
        self.refs = refs

    def pre_start(self) -> Any:
        self.refs[self.index] = self.context.self_ref
        return super().pre_start()


PLACES: dict[str, str | type] = {
    "before_forward": ComputeGradients,  # the actor itself crashes (restarted), not its device
    "ring_chunk": RingChunk,  # OutOfMemory on a told chunk: resumed, the chunk is lost
    "load_resumed": SetState,  # OutOfMemory: the supervisor resumes it
    "load_restarted": SetState,  # RuntimeError: the supervisor restarts it
    "load_refused": "set_state",  # a Failure answer after writing the new state
    "load_slow": "set_state",  # loads after the trainer's ask timed out
    "slow_apply": "apply_gradients",  # applies after the trainer's ask timed out
}
"""Where replica 1's phases fail (`inject_faults`); "mid_backward" and
"mid_optimizer" corrupt state first (`faulty_replica`)."""


def faulty_replica(plan: Plan) -> type[KnownReplica]:
    """`KnownReplica` failing at the phases of `PLACES`, and also:
    "mid_backward": the gradient written, half of it then garbage, then the
    device dies; "mid_optimizer": half the update written, then it dies."""

    class MidBackward(KnownReplica):
        def compute_gradients(self, msg: ComputeGradients) -> Any:
            result = super().compute_gradients(msg)
            model = self.model
            if plan.armed("mid_backward") and model is not None:
                model.grads[: model.n_params // 2] = np.nan  # gradients written, half garbage
                plan.fire("mid_backward")  # ... then the device dies
            return result

    plan.declare("mid_backward")
    return dying_optimizer(inject_faults(MidBackward, plan, PLACES), plan)


PHASES = {
    "before_forward": RuntimeError,
    "mid_backward": ContextPoisoned,
    "all_reduce": ContextPoisoned,
    "mid_optimizer": ContextPoisoned,
}


class Spawned:
    """A trainer over replicas 0 and 2 (plain) and 1 (`faulty_replica`)."""

    def __init__(
        self, system: ActorSystem, plan: Plan, collective: str | Collective, timeout: float
    ) -> None:
        model = Mlp(SIZES, seed=3)
        self.refs: dict[int, Any] = {}
        props = [
            Props(KnownReplica, model, "cpu:0", CONFIG, self.refs, 0),
            Props(faulty_replica(plan), model, "cpu:1", CONFIG, self.refs, 1),
            Props(KnownReplica, model, "cpu:2", CONFIG, self.refs, 2),
        ]
        config = dataclasses.replace(CONFIG, worker_timeout=timeout)
        options = DataParallelOptions(collective)
        self.trainer = system.spawn(DataParallelTrainer.props(config, props, options))

    @property
    def replicas(self) -> list[Any]:
        """The replicas' refs, in rank order."""
        return [self.refs[k] for k in range(3)]


def _spawn(
    system: ActorSystem, plan: Plan, collective: str | Collective, timeout: float = T
) -> Any:
    return Spawned(system, plan, collective, timeout).trainer


# (the ring all-reduce's own fault is covered by tests/train/data_parallel/test_trainer.py)
@pytest.mark.parametrize(
    ("phase", "collective"),
    [(p, c) for p in PHASES for c in ("host", "ring") if (p, c) != ("all_reduce", "ring")],
)
async def test_a_fault_in_any_phase_changes_nothing_and_training_recovers(
    actor_system: ActorSystem, phase: str, collective: str
) -> None:
    plan = Plan()
    reduce: str | Collective = collective
    if collective == "host":  # the host all-reduce fails where the plan says
        reduce = inject_faults(HostCollective, plan, {"all_reduce": "all_reduce"})()
    data = batches()
    dp = _spawn(actor_system, plan, reduce)

    async def replica_weights() -> list[np.ndarray]:
        return await dp.ask(GetReplicaWeights(), timeout=T)

    try:
        error, views = await faulted_run(dp, data, plan, phase, replica_weights, PHASES[phase])
        assert isinstance(error, PHASES[phase]) and "injected" in str(error), repr(error)
        assert plan.fired == [phase]
        assert_unchanged(views)  # no replica applied anything
        after = await replica_weights()
        for w in after[1:]:  # the restarted replica was re-synced
            np.testing.assert_array_equal(w, after[0])
        clean = _spawn(actor_system, Plan(), collective)
        await clean_run(clean, data)
        accuracy = await assert_same_training(dp, clean)
    finally:
        if isinstance(reduce, HostCollective):
            reduce.close()  # a collective given in the options is the caller's to close
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

    error, views = await faulted_run(
        dp, data, plan, "slow_apply", replica_weights, None, delay=SLOW
    )
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
    plan.arm("ring_chunk", OutOfMemory)
    with pytest.raises(OutOfMemory, match="injected"):  # long before the ring's timeout T
        await asyncio.wait_for(dp.ask(Step(*data[FAULT_AT])), 5)
    assert plan.fired == ["ring_chunk"]
    assert_unchanged([before, await replica_weights()])
    # nothing left behind: every replica handled the aborts (RingPing: every
    # earlier message is handled), and the next steps, each over a new ring
    # session, are answered at once and equal the single-device ones
    for replica in spawned.replicas:
        assert await asyncio.wait_for(replica.ask(RingPing()), 5)
    for x, y in data[FAULT_AT + 1 :]:
        await asyncio.wait_for(dp.ask(Step(x, y)), 5)
        await asyncio.wait_for(reference.ask(Step(x, y)), 5)
    await assert_same_training(dp, reference)


LOAD_FAULTS: dict[str, tuple[type[Exception], dict[str, Any]]] = {
    # fault: (what the asker gets, how replica 1's phase is armed)
    "load_refused": (CheckpointError, {"error": CheckpointError, "after": True}),
    "load_resumed": (OutOfMemory, {"error": OutOfMemory}),
    "load_restarted": (RuntimeError, {"error": RuntimeError}),
    "load_slow": (AskTimeoutError, {"error": None, "delay": SLOW}),
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
    expected, how = LOAD_FAULTS[fault]
    plan.arm(fault, **how)
    with pytest.raises(expected) as info:
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


async def test_a_replica_refusing_a_re_sync_is_named_by_its_own_index(
    actor_system: ActorSystem,
) -> None:
    """SyncParams gives replica 0's state to the others (`refs[1:]`): a
    failure of replica 1 was reported as worker 0's."""
    plan = Plan()
    spawned = Spawned(actor_system, plan, "host", T)
    plan.arm("load_refused", CheckpointError, after=True)
    with pytest.raises(CheckpointError, match="injected failure") as info:
        await asyncio.wait_for(spawned.trainer.ask(SyncParams()), 5)
    assert plan.fired == ["load_refused"]
    assert getattr(info.value, "worker_index", None) == 1
    assert "raised by worker 1" in getattr(info.value, "__notes__", [])


@pytest.mark.parametrize("error", [ValueError, OSError])
async def test_a_replica_restarted_after_a_request_error_type_is_re_synced(
    actor_system: ActorSystem, error: type[Exception]
) -> None:
    """An error of a `REQUEST_ERRORS` type that escapes a replica's `receive`
    fails the actor (its supervisor restarts it, its state lost) like any
    other: it was taken for an answered refusal, and the replica not re-synced."""
    data = batches()
    reference = await Trainer.spawn(actor_system, Mlp(SIZES, seed=3), "cpu:0", CONFIG)
    plan = Plan()
    spawned = Spawned(actor_system, plan, "host", T)
    dp = spawned.trainer
    for trainer in (dp, reference):
        await trainer.ask(Step(*data[0]), timeout=T)
    plan.arm("before_forward", error)
    with pytest.raises(error, match="injected"):
        await dp.ask(Step(*data[1]), timeout=T)
    assert plan.fired == ["before_forward"]
    for trainer in (dp, reference):
        await trainer.ask(Step(*data[2]), timeout=T)
    states = await _states(spawned)
    for state in states[1:]:  # bit-identical: weights, optimizer state, step count
        assert state.steps == states[0].steps == 2
        np.testing.assert_array_equal(state.weights, states[0].weights)
        assert_same_optimizer_state(state.optimizer, states[0].optimizer)
    await assert_same_training(dp, reference)


async def test_a_batch_refilled_after_its_timed_out_step_answers_is_not_trained() -> None:
    """Under SYNC the replicas get views of the `Step`'s arrays (CADENCE and
    ASYNC copy them: their `Step` answers before the batch is applied). A
    replica held past `worker_timeout` reads its part after the `Step`
    answered `AskTimeoutError` and the sender refilled it, but its gradient
    is never applied (phase 2 runs only once every replica answered phase 1,
    and the next step's phase 1 overwrites it), so no copy is needed."""
    plan, notes = Plan(), list[Any]()
    noted = noting(ReplicaActor, ComputeGradients, 1, notes)
    replica = inject_faults(noted, plan, {"held": ComputeGradients}, worker=1)
    options = DataParallelOptions(replica_class=replica)

    async def spawn(system: ActorSystem, config: TrainerConfig) -> ActorRef:
        model = Mlp([IN, 8, CLASSES], seed=2)
        return await DataParallelTrainer.spawn(system, model, ["cpu:0", "cpu:1"], config, options)

    await assert_a_late_read_is_not_trained(spawn, plan, notes, batches(3))
