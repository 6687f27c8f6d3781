"""Tests of the ServerShard actor on its own: the seed crate's cases, the
optimizer on the server, validation, the three consistency models at the
message level, and its own checkpoints."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from atomr.accel import ContextPoisoned
from atomr.testkit import Plan, inject_faults
from atomr.train import (
    GetWeights,
    LoadCheckpoint,
    LossKind,
    Mlp,
    OptimizerKind,
    SaveCheckpoint,
    Trainer,
    TrainerConfig,
)
from atomr.train.core.errors import CheckpointError, NonFiniteError, WorkerStateLost
from atomr.train.parameter_server import ParameterServerOptions, RoundFailedError
from atomr.train.parameter_server.consistency import Consistency
from atomr.train.parameter_server.messages import (
    AbortPush,
    GetServerState,
    PullWeights,
    PushGradient,
    ServerState,
    SetServerState,
    StaleGradientError,
    Stats,
)
from atomr.train.parameter_server.server import ServerShard


def _f32(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


async def test_seed_case_one_sgd_step(actor_system) -> None:
    ref = actor_system.spawn(ServerShard.props(_f32(10, 20), OptimizerKind.sgd(0.1), 4))
    version = await ref.ask(PushGradient(0, 0, _f32(1, 2)))
    weights, pulled_version = await ref.ask(PullWeights(0))
    assert version == 1 and pulled_version == 1
    np.testing.assert_allclose(weights, [9.9, 19.8], rtol=1e-6)
    stats = await ref.ask(Stats())
    assert (stats.version, stats.gradients_applied, stats.weights_pulled) == (1, 1, 1)
    assert stats.avg_staleness == 0.0


async def test_learning_rate_alone_means_plain_sgd(actor_system) -> None:
    ref = actor_system.spawn(ServerShard.props([10.0, 20.0], 0.1, None))
    await ref.ask(PushGradient(0, 0, _f32(1, 2)))
    weights, _ = await ref.ask(PullWeights(0))
    np.testing.assert_allclose(weights, [9.9, 19.8], rtol=1e-6)


async def test_stale_push_is_rejected_and_changes_nothing(actor_system) -> None:
    ref = actor_system.spawn(ServerShard.props(_f32(10, 20), OptimizerKind.sgd(0.1), 1))
    await ref.ask(PushGradient(0, 0, _f32(1, 1)))  # staleness 0 -> version 1
    await ref.ask(PushGradient(1, 0, _f32(1, 1)))  # staleness 1 -> version 2
    before, _ = await ref.ask(PullWeights(0))
    with pytest.raises(StaleGradientError) as info:
        await ref.ask(PushGradient(2, 0, _f32(5, 5)))  # staleness 2 > 1
    assert info.value.staleness == 2 and info.value.max_staleness == 1
    after, version = await ref.ask(PullWeights(0))
    assert version == 2
    np.testing.assert_array_equal(after, before)
    stats = await ref.ask(Stats())
    assert stats.gradients_rejected == 1 and stats.gradients_applied == 2
    assert stats.avg_staleness == pytest.approx(0.5) and stats.max_staleness_seen == 1


@pytest.mark.parametrize(
    "push, error",
    [
        (PushGradient(0, 0, _f32(1)), ValueError),  # too short: never padded
        (PushGradient(0, 0, _f32(1, 2, 3)), ValueError),  # too long: never truncated
        (PushGradient(0, 0, _f32(1, np.nan)), FloatingPointError),
        (PushGradient(0, 0, _f32(np.inf, 1)), FloatingPointError),
        (PushGradient(0, 5, _f32(1, 2)), ValueError),  # version from the future
        (PushGradient(-1, 0, _f32(1, 2)), ValueError),
        (PushGradient(0, 0, np.array([1, 2])), TypeError),  # ints are not a gradient
        (PushGradient(0, 0, _f32(1, 2), weight=float("nan")), ValueError),
    ],
)
async def test_bad_push_is_a_failure_that_changes_nothing(actor_system, push, error) -> None:
    ref = actor_system.spawn(ServerShard.props(_f32(10, 20), OptimizerKind.sgd(0.1)))
    with pytest.raises(error):
        await ref.ask(push)
    weights, version = await ref.ask(PullWeights(0))  # same instance, still serving
    assert version == 0
    np.testing.assert_array_equal(weights, [10, 20])
    assert (await ref.ask(PushGradient(0, 0, _f32(1, 2)))) == 1


_HUGE = "w" * 100_000


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (PushGradient(_HUGE, 0, _f32(1, 2)), ValueError),  # type: ignore[arg-type]
        (PushGradient(0, 0, _f32(1, 2), round_id=_HUGE), ValueError),  # type: ignore[arg-type]
        (PushGradient(0, _HUGE, _f32(1, 2)), ValueError),  # type: ignore[arg-type]
        (PushGradient(0, 0, _f32(1, 2), weight=_HUGE), TypeError),  # type: ignore[arg-type]
        (AbortPush(_HUGE, 0, "no gradient"), ValueError),  # type: ignore[arg-type]
        (AbortPush(0, 0, "no gradient", round_id=[_HUGE]), ValueError),  # type: ignore[arg-type]
        (PullWeights(_HUGE), ValueError),  # type: ignore[arg-type]
        (PullWeights(10**100), ValueError),
    ],
    ids=["worker", "round", "version", "weight", "abort", "abort-round", "pull", "pull-big"],
)
async def test_a_bad_argument_is_answered_with_a_bounded_error_and_changes_nothing(
    actor_system, message, error
) -> None:
    """A push, abort or pull naming a worker, round or version that is no
    int >= 0 (a 100,000-character string, say) is answered with a
    ValueError whose text shows the value bounded (`bounded_repr`), not the
    whole of it; a wrongly typed id too (the handlers answer ValueError,
    and the shard is not failed for bad input: it goes on serving). A
    weight that is no number is a TypeError, bounded too (it was Python's
    own "could not convert string to float" with the whole string, and a
    numeric string was taken as a number)."""
    ref = actor_system.spawn(ServerShard.props(_f32(10, 20), OptimizerKind.sgd(0.1), workers=1))
    with pytest.raises(error) as info:
        await ref.ask(message)
    assert len(str(info.value)) < 400
    weights, version = await ref.ask(PullWeights(0))  # same instance, still serving
    assert version == 0
    np.testing.assert_array_equal(weights, [10, 20])


@pytest.mark.parametrize(
    "kind",
    [
        OptimizerKind.sgd(0.05, momentum=0.9, weight_decay=0.01, nesterov=True),
        OptimizerKind.adam(1e-2),
        OptimizerKind.adamw(1e-2, weight_decay=0.1),
    ],
    ids=["sgd-nesterov", "adam", "adamw"],
)
async def test_server_applies_the_configured_optimizer(actor_system, kind) -> None:
    rng = np.random.default_rng(1)
    w0 = rng.standard_normal(7).astype(np.float32)
    grads = [rng.standard_normal(7).astype(np.float32) for _ in range(4)]
    reference = w0.copy()
    opt = kind.create(7)
    for g in grads:
        opt.step(reference, g.copy())
    ref = actor_system.spawn(ServerShard.props(w0, kind, None))
    for i, g in enumerate(grads):
        await ref.ask(PushGradient(0, i, g))
    weights, version = await ref.ask(PullWeights(0))
    assert version == 4
    np.testing.assert_allclose(weights, reference, rtol=1e-6, atol=1e-7)
    # the server's result differs from plain SGD: the optimizer state is real
    assert not np.allclose(weights, w0 - kind.lr * np.sum(grads, axis=0), atol=1e-4)


async def test_synchronous_round_waits_and_averages_by_sample_weight(actor_system) -> None:
    props = ServerShard.props(
        _f32(0, 0), OptimizerKind.sgd(1.0), None, consistency=Consistency.synchronous(), workers=2
    )
    ref = actor_system.spawn(props)
    first = asyncio.ensure_future(ref.ask(PushGradient(0, 0, _f32(1, 0), weight=3.0)))
    await ref.ask(Stats())  # the push has been handled ...
    assert not first.done()  # ... but its reply waits for worker 1
    weights, version = await ref.ask(PullWeights(0))
    assert version == 0 and np.all(weights == 0)  # nothing applied yet
    second = await ref.ask(PushGradient(1, 0, _f32(0, 1), weight=1.0))
    assert second == 1 and await first == 1
    weights, _ = await ref.ask(PullWeights(0))
    np.testing.assert_allclose(weights, [-0.75, -0.25])  # (3*g0 + 1*g1) / 4
    stats = await ref.ask(Stats())
    assert (stats.version, stats.gradients_applied) == (1, 2)
    with pytest.raises(StaleGradientError):  # synchronous means staleness 0
        await ref.ask(PushGradient(0, 0, _f32(1, 1)))


async def test_synchronous_round_with_a_bad_gradient_applies_nothing(actor_system) -> None:
    props = ServerShard.props(
        _f32(0, 0), OptimizerKind.sgd(1.0), None, consistency=Consistency.synchronous(), workers=2
    )
    ref = actor_system.spawn(props)
    with pytest.raises(ValueError):
        await ref.ask(PushGradient(0, 0, _f32(1, 2, 3)))
    with pytest.raises(FloatingPointError):
        await ref.ask(PushGradient(0, 0, _f32(np.nan, 2)))
    pending = asyncio.ensure_future(ref.ask(PushGradient(0, 0, _f32(2, 2))))
    assert await ref.ask(PushGradient(1, 0, _f32(0, 0))) == 1
    assert await pending == 1
    weights, _ = await ref.ask(PullWeights(0))
    np.testing.assert_allclose(weights, [-1.0, -1.0])


async def test_synchronous_round_with_an_abort_applies_nothing_and_answers_every_push(
    actor_system,
) -> None:
    """A worker whose loss was not finite sends `AbortPush` instead of a gradient:
    the round completes without applying anything, every push of it is answered
    promptly with `NonFiniteError`, and the next round starts empty."""
    props = ServerShard.props(
        _f32(0, 0), OptimizerKind.sgd(1.0), None, consistency=Consistency.synchronous(), workers=2
    )
    ref = actor_system.spawn(props)
    pending = asyncio.ensure_future(ref.ask(PushGradient(0, 0, _f32(1, 1))))
    await ref.ask(Stats())
    assert not pending.done()  # waits for worker 1 ...
    with pytest.raises(NonFiniteError, match="worker 1"):
        await asyncio.wait_for(ref.ask(AbortPush(1, 0, "loss is not finite (inf)")), 5)
    with pytest.raises(NonFiniteError, match="worker 1"):  # ... which aborted the round
        await asyncio.wait_for(pending, 5)
    weights, version = await ref.ask(PullWeights(0))
    assert version == 0 and np.all(weights == 0)
    stats = await ref.ask(Stats())
    assert (stats.version, stats.gradients_applied) == (0, 0)
    # the aborted round left nothing behind: the next one holds only its own pushes
    second = asyncio.ensure_future(ref.ask(PushGradient(0, 0, _f32(2, 0))))
    assert await asyncio.wait_for(ref.ask(PushGradient(1, 0, _f32(0, 2))), 5) == 1
    assert await asyncio.wait_for(second, 5) == 1
    weights, _ = await ref.ask(PullWeights(0))
    np.testing.assert_allclose(weights, [-1.0, -1.0])


def _synchronous_pair(actor_system) -> Any:
    """A synchronous shard of two workers on `[0, 0]` with plain SGD at rate 1."""
    props = ServerShard.props(
        _f32(0, 0), OptimizerKind.sgd(1.0), None, consistency=Consistency.synchronous(), workers=2
    )
    return actor_system.spawn(props)


async def _round_one_completes(ref: Any, pending: Any, last: PushGradient) -> None:
    """Round 1 of `_synchronous_pair` holds one push (`pending`, still
    unanswered, nothing applied) and completes with `last`: both answered
    with version 1, the weights moved by the mean of `(2, 0)` and `(0, 2)`."""
    assert not pending.done()
    assert (await ref.ask(Stats())).version == 0
    assert await asyncio.wait_for(ref.ask(last), 5) == 1
    assert await asyncio.wait_for(pending, 5) == 1
    weights, _ = await ref.ask(PullWeights(0))
    np.testing.assert_allclose(weights, [-1.0, -1.0])


@pytest.mark.parametrize("late", ["push", "abort"])
async def test_a_late_push_of_an_earlier_round_is_dropped_not_applied(actor_system, late) -> None:
    """Worker 1's push (or abort) of round 0 arrives after round 1 started
    (its part timed out, the trainer moved on): it used to take worker 1's
    place in round 1, which was then applied with round 0's gradient (or
    dropped by round 0's abort). Now it is refused with `RoundFailedError`,
    nothing of it applied, and round 1 waits for worker 1's push of round 1."""
    ref = _synchronous_pair(actor_system)
    pending = asyncio.ensure_future(ref.ask(PushGradient(0, 0, _f32(2, 0), round_id=1)))
    await ref.ask(Stats())
    stale = (
        PushGradient(1, 0, _f32(100, 100), round_id=0)
        if late == "push"
        else AbortPush(1, 0, "loss is not finite (inf)", round_id=0)
    )
    with pytest.raises(RoundFailedError, match="round 0 .*round 1"):
        await asyncio.wait_for(ref.ask(stale), 5)
    await _round_one_completes(ref, pending, PushGradient(1, 0, _f32(0, 2), round_id=1))


async def test_a_push_of_a_later_round_ends_the_round_left_behind(actor_system) -> None:
    """Worker 0's push of round 0 waits for worker 1, whose part timed out;
    the trainer goes on to round 1. Worker 1's push of round 1 used to
    complete round 0 with it (two rounds' gradients mixed into one update);
    now it ends round 0 (worker 0's push of it is answered with
    `RoundFailedError`, nothing applied) and starts round 1, which
    completes with round 1's pushes alone."""
    ref = _synchronous_pair(actor_system)
    left_behind = asyncio.ensure_future(ref.ask(PushGradient(0, 0, _f32(100, 100), round_id=0)))
    await ref.ask(Stats())
    pending = asyncio.ensure_future(ref.ask(PushGradient(1, 0, _f32(0, 2), round_id=1)))
    with pytest.raises(RoundFailedError, match="round 0 .*round 1"):
        await asyncio.wait_for(left_behind, 5)
    await _round_one_completes(ref, pending, PushGradient(0, 0, _f32(2, 0), round_id=1))


@pytest.mark.parametrize("again", ["push", "abort"])
async def test_a_push_of_a_round_that_was_full_is_dropped_not_waited_on(
    actor_system, again
) -> None:
    """Round 0 is full and dropped (worker 1 aborted it). Worker 0's part is
    then sent again (its worker failed after its push was answered), or the
    trainer withdraws worker 0 from round 0 (`AbortPush`): that push or abort
    used to open round 0 anew and wait for worker 1, which was done with it,
    until the ask timed out (a parameter-server Step took its whole
    `worker_timeout` after a server shard was lost). Now it is refused at
    once with `RoundFailedError`, nothing applied, and round 1 goes on."""
    ref = _synchronous_pair(actor_system)
    dropped = asyncio.ensure_future(ref.ask(PushGradient(0, 0, _f32(100, 100), round_id=0)))
    await ref.ask(Stats())
    with pytest.raises(NonFiniteError, match="worker 1"):
        await asyncio.wait_for(ref.ask(AbortPush(1, 0, "loss is not finite", round_id=0)), 5)
    with pytest.raises(NonFiniteError, match="worker 1"):
        await asyncio.wait_for(dropped, 5)
    repeat = (
        PushGradient(0, 0, _f32(100, 100), round_id=0)
        if again == "push"
        else AbortPush(0, 0, "gave up on its part", round_id=0)
    )
    with pytest.raises(RoundFailedError, match="round 0 .*round 0 was over"):
        await asyncio.wait_for(ref.ask(repeat), 5)
    pending = asyncio.ensure_future(ref.ask(PushGradient(0, 0, _f32(2, 0), round_id=1)))
    await _round_one_completes(ref, pending, PushGradient(1, 0, _f32(0, 2), round_id=1))


async def test_abort_in_bounded_mode_ticks_the_clock_and_applies_nothing(actor_system) -> None:
    """Under bounded staleness an aborted batch still counts as done for the
    worker's clock, so the others' pulls are not held back by it."""
    props = ServerShard.props(
        _f32(0), OptimizerKind.sgd(1.0), None, consistency=Consistency.bounded(1), workers=2
    )
    ref = actor_system.spawn(props)
    await ref.ask(PushGradient(0, 0, _f32(1)))
    await ref.ask(PushGradient(0, 1, _f32(1)))
    blocked = asyncio.ensure_future(ref.ask(PullWeights(0)))  # 2 ahead of worker 1: waits
    await ref.ask(Stats())
    assert not blocked.done()
    assert await ref.ask(AbortPush(1, 2, "loss is not finite (inf)")) == 2  # nothing applied
    weights, version = await asyncio.wait_for(blocked, 5)  # released by worker 1's tick
    assert version == 2 and weights[0] == pytest.approx(-2.0)


async def test_bounded_staleness_pull_waits_for_the_slowest_worker(actor_system) -> None:
    props = ServerShard.props(
        _f32(0), OptimizerKind.sgd(1.0), None, consistency=Consistency.bounded(1), workers=2
    )
    ref = actor_system.spawn(props)
    await ref.ask(PushGradient(0, 0, _f32(1)))
    await ref.ask(PullWeights(0))  # worker 0 is 1 ahead: allowed
    await ref.ask(PushGradient(0, 1, _f32(1)))
    blocked = asyncio.ensure_future(ref.ask(PullWeights(0)))  # 2 ahead: waits
    await ref.ask(Stats())
    assert not blocked.done()
    _, version = await ref.ask(PullWeights(1))  # the slow worker is never blocked
    assert version == 2
    await ref.ask(PushGradient(1, 2, _f32(1)))  # slowest catches up by one
    weights, version = await blocked
    assert version == 3 and weights[0] == pytest.approx(-3.0)
    stats = await ref.ask(Stats())
    assert stats.max_clock_gap == 1


def test_constructor_and_consistency_errors() -> None:
    with pytest.raises(ValueError):
        Consistency.bounded(0)
    with pytest.raises(ValueError):
        Consistency(-1)
    with pytest.raises(ValueError):
        ServerShard(_f32(1), 0.1, -1)
    with pytest.raises(ValueError):
        ServerShard(_f32(1), 0.1, consistency=Consistency.synchronous())
    with pytest.raises(ValueError):
        ServerShard(_f32(np.nan), 0.1)
    with pytest.raises(TypeError):
        ServerShard(_f32(1), "fast")
    with pytest.raises(ValueError, match="float32 or float64"):
        ServerShard(_f32(1), 0.1, dtype=np.int8)


@pytest.mark.parametrize(
    "build",
    [
        lambda s: Consistency.bounded(s),
        lambda s: Consistency(s),
        lambda s: ParameterServerOptions(max_staleness=s),
        lambda s: ServerShard(_f32(1), 0.1, s),
    ],
    ids=["bounded", "Consistency", "options", "shard"],
)
def test_a_staleness_bound_is_a_count_by_the_one_rule(build) -> None:
    """A NumPy integer is a bound (kept as an int); a bool or a float is a
    TypeError, as for every count (`int_at_least`), not a ValueError."""
    for bad in (True, 2.0, "2"):
        with pytest.raises(TypeError, match="must be an int"):
            build(bad)
    made = build(np.int32(2))
    if not isinstance(made, ServerShard):
        bound = made.bound if isinstance(made, Consistency) else made.max_staleness
        assert bound == 2 and type(bound) is int


async def test_a_lone_server_checkpoints_in_the_format_of_every_trainer(
    actor_system, tmp_path
) -> None:
    """A server shard holding a whole model (given its config) writes a
    checkpoint the Trainer loads, and refuses one of another model or a
    missing file without changing anything."""
    model = Mlp([3, 4, 2], seed=0)
    kind = OptimizerKind.adam(1e-2)
    cfg = TrainerConfig(kind, LossKind.CROSS_ENTROPY)
    server = actor_system.spawn(
        ServerShard.props(model.get_params(), kind, model_config=model.config())
    )
    rng = np.random.default_rng(0)
    await server.ask(PushGradient(0, 0, rng.standard_normal(model.n_params).astype(np.float32)))
    await server.ask(SaveCheckpoint(tmp_path / "server.ckpt"))
    trainer = await Trainer.spawn(actor_system, model, "cpu:0", cfg)
    await trainer.ask(LoadCheckpoint(tmp_path / "server.ckpt"))
    np.testing.assert_array_equal(await trainer.ask(GetWeights()), await server.ask(GetWeights()))
    other = await Trainer.spawn(actor_system, Mlp([3, 5, 2]), "cpu:0", cfg)
    await other.ask(SaveCheckpoint(tmp_path / "other.ckpt"))
    before, version = await server.ask(PullWeights(0))
    with pytest.raises(CheckpointError):
        await server.ask(LoadCheckpoint(tmp_path / "other.ckpt"))
    with pytest.raises(OSError):
        await server.ask(LoadCheckpoint(tmp_path / "missing.ckpt"))
    after, version_after = await server.ask(PullWeights(0))
    np.testing.assert_array_equal(after, before)
    assert version_after == version == 1


async def test_a_restarted_shard_given_its_own_state_back_keeps_refusing(actor_system) -> None:
    """A shard restarted after `ContextPoisoned` refuses to serve (its state
    is lost: `WorkerStateLost`). Its state (`GetServerState`), given back by
    `SetServerState` as a failed load's restore does, used to clear that
    refusal, so it served its reset weights as good; now it keeps refusing,
    and a state from elsewhere (a checkpoint's) makes it serve again."""
    plan = Plan()
    shard = inject_faults(ServerShard, plan, {"pull": PullWeights})
    ref = actor_system.spawn(shard.props(_f32(10, 20), OptimizerKind.sgd(0.1), 4))
    await ref.ask(PushGradient(0, 0, _f32(1, 2)))
    plan.arm("pull", ContextPoisoned)
    with pytest.raises(ContextPoisoned):
        await ref.ask(PullWeights(0))
    with pytest.raises(WorkerStateLost):  # restarted: its initial weights, version 0
        await ref.ask(PullWeights(0))
    state = await ref.ask(GetServerState())
    await ref.ask(SetServerState(state))
    with pytest.raises(WorkerStateLost):
        await ref.ask(PullWeights(0))
    await ref.ask(SetServerState(ServerState(_f32(9.9, 19.8), state.optimizer, 1)))
    weights, version = await ref.ask(PullWeights(0))
    np.testing.assert_array_equal(weights, _f32(9.9, 19.8))
    assert version == 1
