"""A round of the parameter server applied once, on every shard or on none;
a checkpoint loaded by every shard or by none.

A part whose push landed before its worker failed must not be applied again
when the trainer sends it again (`TrainBatch.round_id`: the shards accept one
push per worker and round), and a synchronous round that fails on one server
shard (its optimizer dying, or the shard failing on a push and resumed) must
leave every shard as it was (`RollbackRound`), where the other shards used to
keep their part of the update. Each run is compared with a single-device
`Trainer` that trains the same batches, less the failed one. A
`LoadCheckpoint` that fails on one server shard must leave every shard with
its old weights, optimizer state and version (the other shard used to keep
the checkpoint's), and an `Evaluate` must refuse shards left at different
versions (a rollback that failed) instead of evaluating a mixed model.

The faults go in through `atomr.testkit.inject_faults` and
`tests.reliability.faults.dying_optimizer`, given to the trainer as
`ParameterServerOptions.worker_class` / `server_class`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atomr import ActorRef, ActorSystem
from atomr.accel import ContextPoisoned, cpu_devices
from atomr.testkit import ManualClock, await_condition, inject_faults
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
    load_checkpoint,
)
from atomr.train.parameter_server import (
    Consistency,
    ParameterServerWorker,
    RoundFailedError,
    ServerShard,
)
from atomr.train.parameter_server.messages import (
    PushGradient,
    RollbackRound,
    SetServerState,
    TrainBatch,
)
from tests.reliability.faults import (
    FAULT_AT,
    STEPS,
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
    NumberedShard,
    server_stats,
    spawn,
    weights,
)

# a hang (a round waiting for a push that never comes) fails within this many
# seconds instead of the default worker_timeout
_HANG = 10.0

_CONFIG = TrainerConfig(OptimizerKind.adam(0.05), LossKind.CROSS_ENTROPY, worker_timeout=_HANG)


async def _pair(
    system: ActorSystem, workers: int, consistency: Consistency, **options: Any
) -> tuple[ActorRef, ActorRef]:
    """A parameter server of two shards and a single-device `Trainer` of the same model."""
    model = Mlp(TWO_RANGE_SIZES, activation="tanh", seed=4)
    ps = await spawn(
        system,
        model,
        cpu_devices(workers),
        _CONFIG,
        workers=workers,
        shards=2,
        consistency=consistency,
        **options,
    )
    return ps, await Trainer.spawn(system, model, "cpu:0", _CONFIG)


@pytest.mark.parametrize(
    ("workers", "consistency"),
    [(1, Consistency.asynchronous()), (2, Consistency.synchronous())],
    ids=["async", "sync"],
)
async def test_a_part_whose_push_landed_is_not_applied_again(
    actor_system: ActorSystem, workers: int, consistency: Consistency
) -> None:
    """The last worker's device context is poisoned right after it pushed its
    part (the push landed; the worker is restarted instead of answering), and
    the trainer sends the part again. Its gradient used to be applied a
    second time (asynchronous), or the second push waited for a round of its
    own until worker_timeout (synchronous); now every shard answers it
    without applying it, the step succeeds and the run equals the
    single-device Trainer's (one asynchronous worker, or synchronous rounds,
    equal its steps)."""
    plan = Plan()
    worker = inject_faults(ParameterServerWorker, plan, {"pushed": TrainBatch}, worker=workers - 1)
    ps, single = await _pair(actor_system, workers, consistency, worker_class=worker)
    for i, (x, y) in enumerate(batches()):
        if i == FAULT_AT:
            plan.arm("pushed", ContextPoisoned, after=True)
        await ps.ask(Step(x, y), timeout=T)
        await single.ask(Step(x, y), timeout=T)
    assert plan.fired == ["pushed"]
    for st in await server_stats(ps):  # one version per step, one gradient per part
        assert (st.version, st.gradients_applied) == (STEPS, STEPS * workers)
    await assert_same_training(ps, single)


@pytest.mark.parametrize("error", [RuntimeError, ContextPoisoned], ids=["resumed", "restarted"])
@pytest.mark.parametrize(
    ("workers", "consistency"),
    [(1, Consistency.asynchronous()), (2, Consistency.synchronous())],
    ids=["async", "sync"],
)
async def test_a_part_sent_again_after_its_push_landed_reports_its_own_loss(
    actor_system: ActorSystem, workers: int, consistency: Consistency, error: type[Exception]
) -> None:
    """The last worker fails right after it pushed its part (resumed after a
    `RuntimeError`, restarted after its own `ContextPoisoned`), and the
    trainer sends the part again. The worker used to recompute it from the
    weights its round left, so the `Step`'s loss (and gradient norm) was the
    next step's, though the weights were right; now it answers with the
    result it had computed (a restarted one too: its supervisor keeps the
    result for it), and every `Step` reports what the single-device
    Trainer's does."""
    plan = Plan()
    worker = inject_faults(ParameterServerWorker, plan, {"pushed": TrainBatch}, worker=workers - 1)
    ps, single = await _pair(actor_system, workers, consistency, worker_class=worker)
    for i, (x, y) in enumerate(batches()):
        if i == FAULT_AT:
            plan.arm("pushed", error, after=True)
        got = await ps.ask(Step(x, y), timeout=T)
        want = await single.ask(Step(x, y), timeout=T)
        assert got.loss == pytest.approx(want.loss, rel=1e-5), f"step {i}"
        assert got.samples == want.samples and got.applied
        if workers == 1:  # several report an upper bound of the norm
            assert got.grad_norm == pytest.approx(want.grad_norm, rel=1e-4), f"step {i}"
    assert plan.fired == ["pushed"]
    await assert_same_training(ps, single)


async def _round_fails_on_one_shard(
    system: ActorSystem,
    plan: Plan,
    phase: str,
    shard: type[ServerShard],
    error: type[BaseException] = ContextPoisoned,
    workers: int = 2,
    consistency: Consistency | None = None,
) -> BaseException:
    """Train a parameter server of `workers` workers and two shards (`shard`
    its server class; synchronous unless `consistency` says otherwise) and a
    single-device Trainer; `phase` is armed with `error` for the step
    `FAULT_AT`, which must fail leaving every shard's weights and version as
    they were, and the Trainer skips it. The runs must end equal.

    Returns:
        The error the failed step was answered with.
    """
    consistency = consistency or Consistency.synchronous()
    ps, single = await _pair(system, workers, consistency, server_class=shard)
    raised = None
    for i, (x, y) in enumerate(batches()):
        if i != FAULT_AT:
            await ps.ask(Step(x, y), timeout=T)
            await single.ask(Step(x, y), timeout=T)
            continue
        before = await weights(ps)
        plan.arm(phase, error)
        with pytest.raises(RoundFailedError) as info:
            await ps.ask(Step(x, y), timeout=T)
        raised = info.value
        np.testing.assert_array_equal(await weights(ps), before)
        assert [st.version for st in await server_stats(ps)] == [FAULT_AT, FAULT_AT]
    assert plan.fired == [phase]
    for st in await server_stats(ps):
        assert (st.version, st.gradients_applied) == (STEPS - 1, workers * (STEPS - 1))
    await assert_same_training(ps, single)
    assert raised is not None
    return raised


@pytest.mark.parametrize("failing", [0, 1])
async def test_a_synchronous_round_whose_update_fails_on_one_shard_changes_no_shard(
    actor_system: ActorSystem, failing: int
) -> None:
    """Shard `failing`'s optimizer dies half-way through the round's update
    (`ContextPoisoned`): that shard changed nothing, but the other one kept
    its part of the update, and the step was sent again, so the other shard
    applied the round twice, silently. Now the step fails with
    `RoundFailedError` (caused by the shard's error), no shard changed, and
    training goes on as if the step had not been asked."""
    plan = Plan()
    shard = dying_optimizer(NumberedShard, plan, worker=failing)
    error = await _round_fails_on_one_shard(actor_system, plan, "mid_optimizer", shard)
    assert isinstance(error.__cause__, ContextPoisoned)
    notes = getattr(error, "__notes__", [])
    assert f"server shards [{1 - failing}] rolled the failed round back" in "\n".join(notes)


async def test_a_shard_resumed_after_failing_on_a_push_leaves_no_shard_changed(
    actor_system: ActorSystem,
) -> None:
    """Shard 1 fails on the first push of the round (it raises in `receive`
    and is resumed): the other shard applied the round, and shard 1's round
    was completed by the push sent again, computed from the mixed weights.
    Now the worker sending it again finds the shards at different versions
    and refuses (`RoundFailedError`); every shard is rolled back and training
    goes on."""
    plan = Plan()
    shard = inject_faults(NumberedShard, plan, {"push": PushGradient}, worker=1)
    await _round_fails_on_one_shard(actor_system, plan, "push", shard, RuntimeError)


@pytest.mark.parametrize(
    ("phase", "error"),
    [("mid_optimizer", ContextPoisoned), ("push", RuntimeError)],
    ids=["optimizer-dies", "shard-fails-on-the-push"],
)
async def test_an_asynchronous_push_that_fails_on_a_follower_shard_changes_no_shard(
    actor_system: ActorSystem, phase: str, error: type[BaseException]
) -> None:
    """One asynchronous worker, two shards: shard 1 (a follower: shard 0
    decides a push's staleness and applies its range first) fails on its
    range of the push (its optimizer dies, or it raises on the message and
    is resumed). Shard 0 used to keep its range of the update and the part
    was sent again, computed from that half-updated model, so the run
    silently left the single-device Trainer's. Now shard 0 undoes its range
    (`RollbackRound`, as for a synchronous round), the step fails with
    `RoundFailedError` caused by the follower's error, and training goes on
    as if the step had not been asked: equal to the Trainer's."""
    plan = Plan()
    if phase == "push":
        shard = inject_faults(NumberedShard, plan, {"push": PushGradient}, worker=1)
    else:
        shard = dying_optimizer(NumberedShard, plan, worker=1)
    raised = await _round_fails_on_one_shard(
        actor_system, plan, phase, shard, error, workers=1, consistency=Consistency.asynchronous()
    )
    assert isinstance(raised.__cause__, error)
    notes = "\n".join(getattr(raised, "__notes__", []))
    assert "nothing of it is applied on any shard" in notes


async def _leave_a_push_half_applied(
    ps: ActorRef, clock: ManualClock, data: list[tuple[np.ndarray, np.ndarray]], ckpt: Path
) -> None:
    """One asynchronous worker, two `GatedShard`s, a system on `clock`: train
    `FAULT_AT` steps and save `ckpt`; then the worker's push is applied on
    shard 0 and held up at shard 1 (the gate) past shard 0's hold of it
    (twice `worker_timeout`), so shard 0 rolls it back, presuming its client
    dead; the gate opens, shard 1 applies it and the client confirms it to
    both, late: shard 1 keeps it, the push is half-applied, and shard 0
    (told to keep what it undid) refuses to serve."""
    for x, y in data[:FAULT_AT]:
        await ps.ask(Step(x, y), timeout=T)
    await ps.ask(SaveCheckpoint(ckpt), timeout=T)
    GATE.arm(until=lambda: any(type(m).__name__ == "HoldExpired" for m in GATE.received))
    step = asyncio.ensure_future(ps.ask(Step(*data[FAULT_AT]), timeout=T))
    await await_condition(lambda: GATE.held == 0, timeout=T)  # applied on shard 0
    clock.advance(2 * _HANG)  # shard 0's hold expires: the gate opens
    await step  # its client confirmed it
    assert [st.version for st in await server_stats(ps)] == [FAULT_AT, FAULT_AT + 1]


async def _assert_refused_until_loaded(ps: ActorRef, path: Path, *requests: Any) -> None:
    """Every request is refused (`RoundFailedError`) instead of serving the
    model mixed from two versions, and a save (to `path`) writes nothing."""
    for request in (*requests, SaveCheckpoint(path)):
        with pytest.raises(RoundFailedError, match="until a checkpoint is loaded"):
            await ps.ask(request, timeout=T)
    assert not path.exists()  # a save used to write the mixed model
    assert [st.version for st in await server_stats(ps)] == [FAULT_AT, FAULT_AT + 1]


async def test_an_asynchronous_push_left_half_applied_is_refused_until_a_checkpoint_is_loaded(
    tmp_path: Path,
) -> None:
    """A push left half-applied (`_leave_a_push_half_applied`): every later
    `Step` and `Evaluate` is refused (`RoundFailedError`) instead of training
    or evaluating a model mixed from two versions, until a checkpoint is
    loaded; a `SaveCheckpoint` too (it used to save the mixed model)."""
    clock = ManualClock()
    async with ActorSystem("late-confirm", scheduler=clock) as system:
        ps, _single = await _pair(system, 1, Consistency.asynchronous(), server_class=GatedShard)
        data, ckpt = batches(), tmp_path / "before.ckpt"
        await _leave_a_push_half_applied(ps, clock, data, ckpt)
        mixed = tmp_path / "mixed.ckpt"
        requests = (Step(*data[FAULT_AT + 1]), Evaluate(*held_out()))
        await _assert_refused_until_loaded(ps, mixed, *requests)
        await ps.ask(LoadCheckpoint(ckpt), timeout=T)
        for x, y in data[FAULT_AT:]:
            assert (await ps.ask(Step(x, y), timeout=T)).updates == 1
        versions = [st.version for st in await server_stats(ps)]
        assert versions == [len(data)] * 2  # from the checkpoint at FAULT_AT
        await ps.ask(Evaluate(*held_out()), timeout=T)


async def test_a_load_that_fails_leaves_a_refusing_shard_refusing(tmp_path: Path) -> None:
    """Shard 0 refuses to serve (it holds half of a push:
    `_leave_a_push_half_applied`) and a `LoadCheckpoint` fails on shard 1:
    every shard is given back its state from before the load, which used to
    clear shard 0's refusal too, so the trainer then trained on and saved the
    mixed model as good. Now the snapshot says shard 0 was refusing and its
    restore keeps it so, until a load succeeds."""
    plan = Plan()
    shard = inject_faults(GatedShard, plan, {"load": SetServerState}, worker=1)
    clock = ManualClock()
    async with ActorSystem("late-confirm", scheduler=clock) as system:
        ps, _single = await _pair(system, 1, Consistency.asynchronous(), server_class=shard)
        data, ckpt = batches(), tmp_path / "before.ckpt"
        await _leave_a_push_half_applied(ps, clock, data, ckpt)
        plan.arm("load", RuntimeError)
        with pytest.raises(RuntimeError) as info:
            await ps.ask(LoadCheckpoint(ckpt), timeout=T)
        assert plan.fired == ["load"]
        notes = "\n".join(getattr(info.value, "__notes__", []))
        assert "every server shard was given back its state from before the load" in notes
        mixed = tmp_path / "mixed.ckpt"
        await _assert_refused_until_loaded(ps, mixed, Step(*data[FAULT_AT + 1]))
        await ps.ask(LoadCheckpoint(ckpt), timeout=T)
        for x, y in data[FAULT_AT:]:
            assert (await ps.ask(Step(x, y), timeout=T)).updates == 1


def _assert_same_checkpoint(path: Path, other: Path) -> None:
    """The two checkpoints hold the same weights, optimizer state and step."""
    a, b = load_checkpoint(path), load_checkpoint(other)
    np.testing.assert_array_equal(a.weights, b.weights)
    assert a.step == b.step
    assert a.optimizer.keys() == b.optimizer.keys()
    for key, value in a.optimizer.items():
        np.testing.assert_array_equal(np.asarray(value), np.asarray(b.optimizer[key]))


@pytest.mark.parametrize("after", [False, True], ids=["before-loading", "after-loading"])
@pytest.mark.parametrize("failing", [0, 1])
async def test_a_load_that_fails_on_one_server_shard_changes_no_shard(
    actor_system: ActorSystem, tmp_path: Path, failing: int, after: bool
) -> None:
    """Shard `failing` fails on its part of a `LoadCheckpoint` (before
    loading it, or `after` loading it, and is resumed): the other shard used
    to keep the checkpoint's state, a half-loaded model. Now every shard is
    given back its weights, optimizer state and version from before the
    load, the error says so, the next step equals the single-device
    Trainer's from the old state, and a load that succeeds equals the
    Trainer's load of the same checkpoint."""
    plan = Plan()
    shard = inject_faults(NumberedShard, plan, {"load": SetServerState}, worker=failing)
    ps, single = await _pair(actor_system, 2, Consistency.synchronous(), server_class=shard)
    data = batches()
    early, old, now = tmp_path / "early.ckpt", tmp_path / "old.ckpt", tmp_path / "now.ckpt"
    await ps.ask(SaveCheckpoint(early), timeout=T)
    for x, y in data[:FAULT_AT]:
        await ps.ask(Step(x, y), timeout=T)
        await single.ask(Step(x, y), timeout=T)
    await ps.ask(SaveCheckpoint(old), timeout=T)
    plan.arm("load", RuntimeError, after=after)
    with pytest.raises(RuntimeError) as info:
        await ps.ask(LoadCheckpoint(early), timeout=T)
    assert plan.fired == ["load"]
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert f"server shard {failing} failed to load the checkpoint" in notes
    assert "every server shard was given back its state from before the load" in notes
    await ps.ask(SaveCheckpoint(now), timeout=T)
    _assert_same_checkpoint(old, now)
    assert [st.version for st in await server_stats(ps)] == [FAULT_AT, FAULT_AT]
    x, y = data[FAULT_AT]
    await ps.ask(Step(x, y), timeout=T)
    await single.ask(Step(x, y), timeout=T)
    await assert_same_training(ps, single)
    await ps.ask(LoadCheckpoint(early), timeout=T)
    await single.ask(LoadCheckpoint(early), timeout=T)
    for x, y in data[FAULT_AT + 1 :]:
        await ps.ask(Step(x, y), timeout=T)
        await single.ask(Step(x, y), timeout=T)
    await assert_same_training(ps, single)


async def test_evaluate_refuses_shards_at_different_versions(
    actor_system: ActorSystem, tmp_path: Path
) -> None:
    """A synchronous round fails on shard 0 (its optimizer dies) and shard 1
    fails to roll it back: the shards are one version apart. `Evaluate` used
    to evaluate that mixed model; now it refuses with `RoundFailedError`, as
    a synchronous worker's step does (`ShardedClient.check_versions`), until
    a checkpoint is loaded."""
    plan = Plan()
    rollback = inject_faults(NumberedShard, plan, {"rollback": RollbackRound}, worker=1)
    shard = dying_optimizer(rollback, plan, worker=0)
    ps, single = await _pair(actor_system, 2, Consistency.synchronous(), server_class=shard)
    data = batches()
    for x, y in data[:FAULT_AT]:
        await ps.ask(Step(x, y), timeout=T)
        await single.ask(Step(x, y), timeout=T)
    await ps.ask(SaveCheckpoint(tmp_path / "old.ckpt"), timeout=T)
    plan.arm("mid_optimizer", ContextPoisoned)
    plan.arm("rollback", RuntimeError)
    with pytest.raises(RoundFailedError):
        await ps.ask(Step(*data[FAULT_AT]), timeout=T)
    assert plan.fired == ["mid_optimizer", "rollback"]
    assert [st.version for st in await server_stats(ps)] == [FAULT_AT, FAULT_AT + 1]
    with pytest.raises(RoundFailedError, match="versions"):
        await ps.ask(Evaluate(*held_out()), timeout=T)
    await ps.ask(LoadCheckpoint(tmp_path / "old.ckpt"), timeout=T)
    await assert_same_training(ps, single)


@pytest.mark.parametrize(
    "consistency", [Consistency.asynchronous(), Consistency.synchronous()], ids=["async", "sync"]
)
async def test_a_batch_without_a_round_id_is_refused_by_a_worker_of_several_shards(
    actor_system: ActorSystem, consistency: Consistency
) -> None:
    """A `TrainBatch` without a `round_id` (the trainer numbers every batch;
    a user asking a worker directly need not) was pushed across the shards:
    had it failed on a follower shard, the shards before it kept it, as "the
    push carries no round id, so it cannot be undone". A worker of several
    shards now refuses it before it pulls anything, and no shard changes."""
    KnownWorker.refs = {}
    ps, _ = await _pair(actor_system, 1, consistency, worker_class=KnownWorker)
    before, stats = await weights(ps), await server_stats(ps)
    (worker,) = KnownWorker.refs.values()
    x, y = next(iter(batches()))
    for round_id in (None, -1, True, "3"):
        with pytest.raises(ValueError, match="round_id") as info:
            await worker.ask(TrainBatch(x, y, round_id=round_id), timeout=T)  # type: ignore[arg-type]
        if round_id is None:
            assert "a push across 2 server shards needs a round_id" in str(info.value)
    np.testing.assert_array_equal(await weights(ps), before)
    assert await server_stats(ps) == stats
    await ps.ask(Step(x, y), timeout=T)  # the trainer's batches carry their round
    assert [st.version for st in await server_stats(ps)] == [1, 1]


async def test_a_worker_of_one_shard_takes_a_batch_without_a_round_id(
    actor_system: ActorSystem,
) -> None:
    """With one server shard a push cannot be half-applied: a `TrainBatch`
    without a `round_id` is still trained (and not deduplicated)."""
    KnownWorker.refs = {}
    model = Mlp(TWO_RANGE_SIZES, activation="tanh", seed=4)
    ps = await spawn(
        actor_system, model, cpu_devices(1), _CONFIG, workers=1, worker_class=KnownWorker
    )
    (worker,) = KnownWorker.refs.values()
    x, y = next(iter(batches()))
    for _ in range(2):
        await worker.ask(TrainBatch(x, y), timeout=T)
    assert [st.version for st in await server_stats(ps)] == [2]
