"""A push across several server shards is kept by every shard or by none,
with several asynchronous workers too (`_hold.py`).

Every shard holds the push it applied, every other message waiting, until
the push's client confirms it or rolls it back. Another worker's push used
to land on shard 0 on top of a push whose range then failed on shard 1, so
shard 0 could not undo it and refused to serve until a checkpoint was
loaded. The faults go in through `tests.reliability.faults.dying_optimizer`
and the gate of `GatedShard` (tests/train/parameter_server/common.py), given
to the trainer as `ParameterServerOptions.server_class`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atomr import ActorRef, ActorStoppedError, ActorSystem, AskTimeoutError
from atomr.accel import ContextPoisoned, cpu_devices
from atomr.testkit import ManualClock, await_condition
from atomr.train import (
    Evaluate,
    LoadCheckpoint,
    LossKind,
    Mlp,
    OptimizerKind,
    SaveCheckpoint,
    Step,
    Trainer,
    TrainerConfig,
)
from atomr.train.core.partition import split_bounds
from atomr.train.parameter_server import Consistency, RoundFailedError, ServerShard
from atomr.train.parameter_server._client import ShardedClient
from atomr.train.parameter_server.messages import (
    AbortPush,
    ConfirmPush,
    GetServerState,
    PullWeights,
    PushGradient,
    RollbackRound,
    ServerState,
    SetServerState,
    Stats,
    TrainBatch,
)
from tests.reliability.faults import (
    FAULT_AT,
    Plan,
    T,
    assert_same_training,
    batches,
    dying_optimizer,
    held_out,
)
from tests.train.parameter_server.common import (
    GATE,
    TWO_RANGE_SIZES,
    GatedShard,
    KnownWorker,
    server_stats,
    spawn,
    weights,
)

_CONFIG = TrainerConfig(OptimizerKind.adam(0.05), LossKind.CROSS_ENTROPY, worker_timeout=10.0)


async def _pair(system: ActorSystem, plan: Plan) -> tuple[ActorRef, ActorRef]:
    """Two asynchronous workers and two gated shards, shard 1's optimizer
    dying when `plan` says so; and a single-device `Trainer` of the model."""
    model = Mlp(TWO_RANGE_SIZES, activation="tanh", seed=4)
    KnownWorker.refs = {}
    ps = await spawn(
        system,
        model,
        cpu_devices(2),
        _CONFIG,
        workers=2,
        shards=2,
        consistency=Consistency.asynchronous(),
        server_class=dying_optimizer(GatedShard, plan, worker=1),
        worker_class=KnownWorker,
    )
    return ps, await Trainer.spawn(system, model, "cpu:0", _CONFIG)


async def test_a_push_failing_on_one_shard_leaves_every_shard_as_if_never_sent(
    actor_system: ActorSystem,
) -> None:
    """Two asynchronous workers, two shards, a deterministic schedule: the
    workers take the batches in turn, and at step `FAULT_AT` worker 0's push
    is applied on shard 0, worker 1's push reaches shard 0 after it, and
    shard 1's optimizer dies in worker 0's range. Shard 0 used to apply
    worker 1's push on top, could not undo worker 0's and refused every
    later push and pull (`RoundFailedError`) until a checkpoint was loaded.
    Now worker 1's push waits until worker 0's is undone on every shard:
    the weights equal those before worker 0's push plus worker 1's, the run
    goes on without a refusal, and it equals the single-device Trainer's
    that skips worker 0's batch."""
    plan = Plan()
    ps, single = await _pair(actor_system, plan)
    data = batches()
    assert FAULT_AT % 2 == 0  # the last batch before it is worker 1's, which keeps its weights
    for i, (x, y) in enumerate(data[:FAULT_AT]):
        reuse = 1 if i == FAULT_AT - 1 else None
        batch = TrainBatch(x, y, reuse_generation=reuse, round_id=i)
        await KnownWorker.refs[i % 2].ask(batch, timeout=T)
        await single.ask(Step(x, y), timeout=T)
    GATE.arm()
    plan.arm("mid_optimizer", ContextPoisoned)
    failed = asyncio.ensure_future(
        KnownWorker.refs[0].ask(TrainBatch(*data[FAULT_AT], round_id=FAULT_AT), timeout=T)
    )
    await await_condition(lambda: GATE.held == 0, timeout=T)  # applied on shard 0
    # worker 1 starts from the weights its last push left: it pushes at once
    batch = TrainBatch(*data[FAULT_AT + 1], reuse_generation=1, round_id=FAULT_AT + 1)
    result = await KnownWorker.refs[1].ask(batch, timeout=T)
    assert GATE.seen == [0, 0, 1]  # worker 0's pull and push, then worker 1's push
    with pytest.raises(RoundFailedError) as info:
        await failed
    assert plan.fired == ["mid_optimizer"]
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "nothing of it is applied on any shard" in notes
    assert result.stats.applied
    await single.ask(Step(*data[FAULT_AT + 1]), timeout=T)
    np.testing.assert_array_equal(await weights(ps), await weights(single))
    assert [st.version for st in await server_stats(ps)] == [FAULT_AT + 1] * 2
    for i in range(FAULT_AT + 2, len(data)):  # no refusal: the run goes on
        await KnownWorker.refs[i % 2].ask(TrainBatch(*data[i], round_id=i), timeout=T)
        await single.ask(Step(*data[i]), timeout=T)
    await assert_same_training(ps, single)
    assert [st.version for st in await server_stats(ps)] == [len(data) - 1] * 2


async def test_a_step_whose_push_failed_on_one_shard_keeps_the_other_workers_part(
    actor_system: ActorSystem, tmp_path: Path
) -> None:
    """Two asynchronous workers take their parts of a `Step` at once; shard 1
    dies in the range of the first push to reach it, held there until
    shard 0 had the other worker's pull or push. The `Step` fails with
    `RoundFailedError` noting that nothing of that push is applied; every
    shard holds the weights from before the step plus the other worker's
    part (equal to a single-device Trainer, loaded from the same state,
    stepping on that part); and training, evaluating and saving go on
    without a refusal."""
    plan = Plan()
    ps, single = await _pair(actor_system, plan)
    data = batches()
    for x, y in data[:FAULT_AT]:
        await ps.ask(Step(x, y), timeout=T)
    before = tmp_path / "before.ckpt"
    await ps.ask(SaveCheckpoint(before), timeout=T)
    GATE.arm()
    plan.arm("mid_optimizer", ContextPoisoned)
    with pytest.raises(RoundFailedError) as info:
        await ps.ask(Step(*data[FAULT_AT]), timeout=T)
    assert plan.fired == ["mid_optimizer"]
    assert "nothing of it is applied on any shard" in "\n".join(info.value.__notes__)
    versions = [st.version for st in await server_stats(ps)]
    assert versions == [2 * FAULT_AT + 1] * 2
    kept = 1 - (GATE.held or 0)  # the worker whose part was kept
    lo, hi = split_bounds(len(data[FAULT_AT][1]), 2)[kept]
    await single.ask(LoadCheckpoint(before), timeout=T)
    await single.ask(Step(data[FAULT_AT][0][lo:hi], data[FAULT_AT][1][lo:hi]), timeout=T)
    np.testing.assert_allclose(await weights(ps), await weights(single), atol=2e-5)
    for x, y in data[FAULT_AT + 1 :]:
        assert (await ps.ask(Step(x, y), timeout=T)).updates == 2
    await ps.ask(Evaluate(*held_out()), timeout=T)
    await ps.ask(SaveCheckpoint(tmp_path / "after.ckpt"), timeout=T)
    assert (tmp_path / "after.ckpt").exists()


async def test_a_push_held_for_a_worker_stopped_before_its_confirm_is_rolled_back_at_once() -> None:
    """Worker 0's push is applied and held on shard 0, on its way to shard 1,
    when the worker is stopped. Its client neither confirmed nor rolled it
    back, so the shards held it until its deadline (twice the ask timeout;
    here never: the clock is a manual one), and worker 1's push waited for it
    until its ask timed out. The client now rolls the push back on every
    shard as it is stopped: worker 1's push is taken at once, and the weights
    equal the single-device Trainer's stepping on worker 1's batch alone."""
    async with ActorSystem("hold-owner-gone", scheduler=ManualClock()) as system:
        ps, single = await _pair(system, Plan())
        data, gone = batches(), asyncio.Event()
        GATE.arm(gone.is_set)
        first = KnownWorker.refs[0].ask(TrainBatch(*data[0], round_id=0), timeout=T)
        first = asyncio.ensure_future(first)
        await await_condition(lambda: GATE.held == 0, timeout=T)  # held on shard 0
        await KnownWorker.refs[0].stop()
        gone.set()  # shard 1 takes the push now, its client gone
        with pytest.raises(ActorStoppedError):
            await first
        result = await KnownWorker.refs[1].ask(TrainBatch(*data[1], round_id=1), timeout=T)
        assert result.stats.applied
        await single.ask(Step(*data[1]), timeout=T)
        np.testing.assert_array_equal(await weights(ps), await weights(single))
        assert [st.version for st in await server_stats(ps)] == [1, 1]


def _shard(system: ActorSystem) -> ActorRef:
    """A server shard of 4 weights, plain SGD 0.5, one worker."""
    return system.spawn(ServerShard.props(np.ones(4, np.float32), 0.5, workers=1))


def _push(round_id: int | None = 0, hold: Any = 5.0) -> PushGradient:
    return PushGradient(0, 0, np.ones(4, np.float32), round_id=round_id, hold=hold)


async def test_a_held_push_keeps_other_pushes_waiting_until_it_is_confirmed() -> None:
    """A held push (`PushGradient.hold`) is answered at once; until its client
    confirms it (`ConfirmPush`) another push waits, and a pull gets the
    weights from before it (never ones that may be undone)."""
    async with ActorSystem("hold-confirm") as system:
        shard = _shard(system)
        assert await shard.ask(_push(), timeout=T) == 1
        second = asyncio.ensure_future(shard.ask(_push(1, None), timeout=T))
        w, version = await shard.ask(PullWeights(0), timeout=T)
        assert version == 0
        np.testing.assert_array_equal(w, np.ones(4, np.float32))
        assert (await shard.ask(Stats(), timeout=T)).version == 1  # Stats passes
        assert not second.done()
        shard.tell(ConfirmPush(0, 0))
        assert await second == 2
        w, version = await shard.ask(PullWeights(0), timeout=T)
        assert version == 2
        np.testing.assert_array_equal(w, np.zeros(4, np.float32))


async def test_a_hold_past_its_deadline_is_rolled_back_and_a_late_confirm_refused() -> None:
    """No confirm within the hold: the shard rolls the push back itself (its
    client is presumed dead) and applies the push that waited, to the old
    weights. A confirm that comes after that (the other shards kept the
    push) makes it refuse every push and pull with `RoundFailedError` until
    it is given a state."""
    clock = ManualClock()
    async with ActorSystem("hold-deadline", scheduler=clock) as system:
        shard = _shard(system)
        await shard.ask(_push(), timeout=T)
        second = asyncio.ensure_future(shard.ask(_push(1, None), timeout=T))
        await shard.ask(Stats(), timeout=T)  # the second push is stashed
        clock.advance(5.0)
        assert await second == 1
        w, version = await shard.ask(PullWeights(0), timeout=T)
        assert version == 1
        np.testing.assert_array_equal(w, np.full(4, 0.5, np.float32))
        shard.tell(ConfirmPush(0, 0))
        for request in (_push(2, None), PullWeights(0)):
            with pytest.raises(RoundFailedError, match="until a checkpoint is loaded"):
                await shard.ask(request, timeout=T)
        state = await shard.ask(GetServerState(), timeout=T)
        assert state.refusing is not None  # it says so
        fresh = ServerState(np.zeros(4, np.float32), state.optimizer, state.version)
        await shard.ask(SetServerState(fresh), timeout=T)
        assert await shard.ask(_push(2, None), timeout=T) == 2


async def test_a_hold_after_one_that_ended_still_expires_at_its_own_deadline() -> None:
    """The shard times its holds with one timer, left running when a hold
    ends: started for a hold kept at once, it falls due during the next one,
    which is then held on until its own deadline and rolled back there."""
    clock = ManualClock()
    async with ActorSystem("hold-next-deadline", scheduler=clock) as system:
        shard = _shard(system)
        assert await shard.ask(_push(0), timeout=T) == 1  # its deadline: 5
        shard.tell(ConfirmPush(0, 0))
        clock.advance(3.0)
        assert await shard.ask(_push(1), timeout=T) == 2  # its deadline: 8
        waiting = asyncio.ensure_future(shard.ask(_push(2, None), timeout=T))
        clock.advance(2.0)  # the first hold's timer falls due: the second is held on
        assert (await shard.ask(PullWeights(0), timeout=T))[1] == 1
        assert not waiting.done()
        clock.advance(3.0)  # its own deadline: rolled back, the waiting push applied
        assert await waiting == 2
        w, version = await shard.ask(PullWeights(0), timeout=T)
        assert version == 2
        np.testing.assert_array_equal(w, np.zeros(4, np.float32))


@pytest.mark.parametrize(
    ("round_id", "hold", "error"),
    [(0, 0.0, ValueError), (0, -1.0, ValueError), (0, "5", TypeError), (None, 5.0, ValueError)],
)
async def test_a_bad_hold_is_refused_changing_nothing(
    actor_system: ActorSystem, round_id: int | None, hold: Any, error: type[Exception]
) -> None:
    """A hold that is not a number of seconds > 0, or one without a round id
    (its client confirms it by it), is refused before anything changes."""
    shard = _shard(actor_system)
    with pytest.raises(error):
        await shard.ask(_push(round_id, hold), timeout=T)
    assert (await shard.ask(Stats(), timeout=T)).version == 0
    await shard.ask(PullWeights(0), timeout=T)  # nothing held


async def test_a_pull_freed_by_a_held_push_waits_until_it_is_undone(
    actor_system: ActorSystem,
) -> None:
    """Bounded staleness (s = 1), two workers: worker 0, two pushes ahead,
    pulls and waits for worker 1's clock. Worker 1's held push used to free it at once, with
    weights holding that push, which its client then rolled back; now the
    clock ticks when the hold ends, and the pull gets the weights without it."""
    props = ServerShard.props(
        np.ones(4, np.float32), 0.5, workers=2, consistency=Consistency.bounded(1)
    )
    shard = actor_system.spawn(props)
    for r in (0, 1):
        await shard.ask(PushGradient(0, r, np.ones(4, np.float32), round_id=r), timeout=T)
    pull = asyncio.ensure_future(shard.ask(PullWeights(0), timeout=T))
    await shard.ask(Stats(), timeout=T)  # the pull waits for worker 1's clock
    assert not pull.done()
    held = PushGradient(1, 0, np.ones(4, np.float32), round_id=0, hold=T)
    assert await shard.ask(held, timeout=T) == 3
    await shard.ask(Stats(), timeout=T)
    assert not pull.done()
    assert await shard.ask(RollbackRound((0,), 1), timeout=T) is True
    w, version = await pull
    assert version == 2
    np.testing.assert_array_equal(w, np.zeros(4, np.float32))


async def test_a_push_rolled_back_before_it_came_is_never_applied(
    actor_system: ActorSystem,
) -> None:
    """A client gave its push up (an ask timed out) and rolled it back on a
    shard it had not reached yet (queued behind another worker's hold): the
    push used to be applied when it came, and held until its deadline. Now
    the rollback takes its round: the push is answered, applying nothing."""
    shard = _shard(actor_system)
    assert await shard.ask(RollbackRound((0,), 0), timeout=T) is False
    assert await shard.ask(_push(), timeout=T) == 0
    w, version = await shard.ask(PullWeights(0), timeout=T)  # nothing held
    assert version == 0
    np.testing.assert_array_equal(w, np.ones(4, np.float32))


async def test_a_push_rolled_back_where_it_failed_counts_once_for_its_workers_clock(
    actor_system: ActorSystem,
) -> None:
    """Bounded staleness (s = 1): worker 1's push failed on this shard
    (nothing applied) and its client rolled it back, then aborted the batch
    (`AbortPush`), as a worker does. The rollback takes the push's round, so
    the abort is a copy: it must not be the only tick of worker 1's clock,
    or worker 0's pull, waiting for it, would wait for good. It is answered."""
    props = ServerShard.props(
        np.ones(4, np.float32), 0.5, workers=2, consistency=Consistency.bounded(1)
    )
    shard = actor_system.spawn(props)
    for r in (0, 1):
        await shard.ask(PushGradient(0, r, np.ones(4, np.float32), round_id=r), timeout=T)
    pull = asyncio.ensure_future(shard.ask(PullWeights(0), timeout=T))
    await shard.ask(Stats(), timeout=T)
    assert not pull.done()  # two pushes ahead of worker 1
    assert await shard.ask(RollbackRound((0,), 1), timeout=T) is False
    assert await shard.ask(AbortPush(1, 2, "rolled back", 0), timeout=T) == 2
    assert (await pull)[1] == 2


async def test_a_push_whose_first_ask_timed_out_counts_as_done_on_every_shard(
    actor_system: ActorSystem,
) -> None:
    """Bounded staleness (s = 1), two workers, two shards. Worker 0's push
    waits on shard 0 behind worker 1's held push until its ask times out:
    its client gave it up on shard 0 only, so shard 1 never counted worker
    0's batch, and worker 1, two batches on, had its pull there held for
    good. Now the push is given up on every shard: each takes its round (a
    batch done), and the pull is answered."""
    props = [
        ServerShard.props(
            np.ones(2, np.float32), 0.5, workers=2, consistency=Consistency.bounded(1)
        )
        for _ in range(2)
    ]
    shards = [actor_system.spawn(p) for p in props]
    client = ShardedClient(shards, [(0, 2), (2, 4)], timeout=0.5)
    grad = np.ones(2, np.float32)
    assert await shards[0].ask(PushGradient(1, 0, grad, round_id=0, hold=T), timeout=T) == 1
    with pytest.raises(AskTimeoutError):  # stashed behind worker 1's held push
        await client.push(0, [0, 0], np.ones(4, np.float32), round_id=0)
    held = PushGradient(1, 0, grad, arbitrated_staleness=0, round_id=0, hold=T)
    assert await shards[1].ask(held, timeout=T) == 1
    for shard in shards:
        shard.tell(ConfirmPush(1, 0))
        assert await shard.ask(PushGradient(1, 1, grad, round_id=1), timeout=T) == 2
    for shard in shards:  # worker 1 two batches on, worker 0 one: within s = 1
        assert (await shard.ask(PullWeights(1), timeout=T))[1] == 2
