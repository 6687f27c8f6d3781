"""`ApplyPolicy.CADENCE` (flodl's El Che): a round of several `Step`s equals
one single-device step on the union of its batches, with equal speeds and
with a 3:1 speed split, and through `fit` on digits with pinned and with
measured rounds; quotas follow the replicas' compute, not their feed (exact
time); checkpoints close an open round; bad options."""

from __future__ import annotations

import gc
import logging
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from atomr import ActorSystem, Props
from atomr.accel import DeviceActor, cpu_devices
from atomr.testkit import Plan, inject_faults, slow_device
from atomr.train import (
    GetWeights,
    LossKind,
    Mlp,
    OptimizerKind,
    SaveCheckpoint,
    Step,
    Trainer,
    TrainerConfig,
    fit,
    load_checkpoint,
)
from atomr.train.core import CloseRound, StepStats, load_digits_split, synthetic_classification
from atomr.train.data_parallel import (
    ApplyPolicy,
    DataParallelOptions,
    DataParallelTrainer,
    GetReplicaWeights,
    ReplicaActor,
    SetReplicas,
)
from atomr.train.data_parallel.messages import ComputeGradients, GradientResult
from atomr.train.fit import FitCallback, FitPosition, epoch_order

from .feed_clock import FeedClock, feed, timed_replica

CONFIG = TrainerConfig(OptimizerKind.adamw(0.01), LossKind.CROSS_ENTROPY, gradient_clip=1.0)
X, Y = synthetic_classification(160, 6, 3, seed=4)
B = [(X[16 * k : 16 * k + 16], Y[16 * k : 16 * k + 16]) for k in range(10)]


def _cadence(**kw: object) -> DataParallelOptions:
    return DataParallelOptions(policy=ApplyPolicy.CADENCE, cadence_auto_tune=False, **kw)  # type: ignore[arg-type]


async def test_equal_speeds_and_anchor_one_equal_sync_on_pairs_of_batches() -> None:
    # speeds pinned equal: measured ones follow the machine's load (a replica
    # timed 1.5x slower on a busy runner gets quotas 1 and 2: a round of 3)
    async with ActorSystem("cadence") as system:
        dp = await DataParallelTrainer.spawn(system, Mlp([6, 8, 3]), cpu_devices(2), CONFIG,
                                             _cadence(cadence_measure_speeds=False))  # fmt: skip
        sync = await DataParallelTrainer.spawn(system, Mlp([6, 8, 3]), cpu_devices(2), CONFIG)
        for k in range(0, 6, 2):
            first = await dp.ask(Step(*B[k]))
            assert (first.applied, first.samples) == (False, 0)  # dispatched, answered at once
            closing = await dp.ask(Step(*B[k + 1]))
            assert closing.applied and closing.samples == 32
            both = (np.concatenate([B[k][0], B[k + 1][0]]), np.concatenate([B[k][1], B[k + 1][1]]))
            reference = await sync.ask(Step(*both))
            assert closing.loss == pytest.approx(reference.loss, rel=1e-5)
        np.testing.assert_allclose(
            await dp.ask(GetWeights()), await sync.ask(GetWeights()), rtol=1e-5, atol=1e-6
        )
        a, b = await dp.ask(GetReplicaWeights())
        np.testing.assert_array_equal(a, b)


async def test_a_three_to_one_round_equals_one_device_on_the_union() -> None:
    async with ActorSystem("cadence") as system:
        dp = await DataParallelTrainer.spawn(system, Mlp([6, 8, 3]), cpu_devices(2), CONFIG,
                                             _cadence(speed_hint=(3.0, 1.0)))  # fmt: skip
        one = await Trainer.spawn(system, Mlp([6, 8, 3]), "cpu:0", CONFIG)
        replies = [await dp.ask(Step(*b)) for b in B[:4]]  # quotas 3 and 1: one round
        assert [r.applied for r in replies] == [False, False, False, True]
        union = (np.concatenate([b[0] for b in B[:4]]), np.concatenate([b[1] for b in B[:4]]))
        await one.ask(Step(*union))
        np.testing.assert_allclose(
            await dp.ask(GetWeights()), await one.ask(GetWeights()), rtol=1e-5, atol=1e-6
        )


async def test_a_checkpoint_closes_the_open_round(tmp_path: Path) -> None:
    async with ActorSystem("cadence") as system:
        dp = await DataParallelTrainer.spawn(system, Mlp([6, 8, 3]), cpu_devices(2), CONFIG,
                                             _cadence(cadence_anchor=2))  # fmt: skip
        one = await Trainer.spawn(system, Mlp([6, 8, 3]), "cpu:0", CONFIG)
        for b in B[:3]:  # quotas 2 and 2: the round is open after 3
            assert not (await dp.ask(Step(*b))).applied
        await dp.ask(SaveCheckpoint(tmp_path / "c.ckpt"))
        union = (np.concatenate([b[0] for b in B[:3]]), np.concatenate([b[1] for b in B[:3]]))
        await one.ask(Step(*union))
        saved = load_checkpoint(tmp_path / "c.ckpt")
        assert saved.step == 1
        np.testing.assert_allclose(saved.weights, await one.ask(GetWeights()), rtol=1e-5, atol=1e-6)


async def test_a_replica_left_out_of_a_closed_round_keeps_its_speed() -> None:
    # the first round closes with one batch, on replica 0: replica 1 was not
    # measured, and must not look slower for it (it did, by the gap between
    # the hint's unitless 1.0 and a measured time, and got half the quota)
    async with ActorSystem("cadence") as system:
        dp = await DataParallelTrainer.spawn(system, Mlp([6, 8, 3]), cpu_devices(2), CONFIG,
                                             _cadence())  # fmt: skip
        assert not (await dp.ask(Step(*B[0]))).applied
        assert (await dp.ask(CloseRound())).samples == 16
        replies = [await dp.ask(Step(*b)) for b in B[1:3]]  # quotas 1 and 1 again
        assert [r.applied for r in replies] == [False, True]


class _Counting(ReplicaActor):
    """A replica that counts the batches it computes, by replica index."""

    batches: Counter[int] = Counter()

    def compute_gradients(self, msg: ComputeGradients) -> GradientResult:
        _Counting.batches[self.index] += 1
        return super().compute_gradients(msg)


async def test_a_slow_replica_takes_a_batch_before_a_round_closed_early() -> None:
    # quotas 8 and 1 (the hint, not measured): the slow replica's one batch
    # went last, so a round closed after 2 batches (an epoch's end) never
    # reached it, and a replica once measured slow was never measured again
    _Counting.batches.clear()
    options = _cadence(speed_hint=(8.0, 1.0), cadence_measure_speeds=False, replica_class=_Counting)
    async with ActorSystem("cadence") as system:
        dp = await DataParallelTrainer.spawn(
            system, Mlp([6, 8, 3]), cpu_devices(2), CONFIG, options
        )
        for b in B[:2]:
            assert not (await dp.ask(Step(*b))).applied
        assert (await dp.ask(CloseRound())).samples == 32
    assert _Counting.batches == {0: 1, 1: 1}


async def _fed_rounds(seconds: tuple[float, float], hint: tuple[float, float] | None,
                      rounds: int) -> list[tuple[int, int]]:  # fmt: skip
    """Each round's batches per replica, the replicas taking `seconds` per
    batch (exact time), a batch coming 1 s after the last one was done."""
    clock = FeedClock()
    options = _cadence(speed_hint=hint, cadence_anchor=2, clock=clock.time,
                       replica_class=timed_replica(clock, seconds))  # fmt: skip
    counts: list[tuple[int, int]] = []
    async with ActorSystem("cadence") as system:
        dp = await DataParallelTrainer.spawn(system, Mlp([6, 8, 3]), cpu_devices(2), CONFIG,
                                             options)  # fmt: skip
        k = opened = 0
        while len(counts) < rounds:
            stats = await feed(dp, B[k % len(B)], clock, gap=1.0)
            k += 1
            if stats.applied:
                done = Counter(clock.batches[opened:])
                counts.append((done[0], done[1]))
                opened = len(clock.batches)
    return counts


async def test_equal_replicas_fed_slowly_come_to_equal_quotas_and_stay() -> None:
    # the replicas wait on their feed, not on their compute: timed from a
    # replica's first batch to its last result, a round measured mostly the
    # feed, so the replica given more batches looked faster; from a 2:1 hint
    # the quotas grew 4, 5, ... 11 to 2 (in real runs noise set it off: 3 to 14)
    counts = await _fed_rounds((0.01, 0.01), (2.0, 1.0), rounds=8)
    assert counts[0] == (4, 2)  # the hint
    assert counts[-5:] == [(2, 2)] * 5
    assert await _fed_rounds((0.01, 0.01), None, rounds=4) == [(2, 2)] * 4


async def test_a_three_times_slower_replica_fed_slowly_comes_to_a_third() -> None:
    # before: 5 to 2, the feed's time counted in both replicas' speeds
    counts = await _fed_rounds((0.01, 0.03), None, rounds=8)
    assert counts[0] == (2, 2)
    assert counts[-4:] == [(6, 2)] * 4


DIGITS = load_digits_split(seed=0)
DIGITS_CONFIG = TrainerConfig(OptimizerKind.adam(0.01), LossKind.CROSS_ENTROPY)


def _digits_model() -> Mlp:
    # float64: the replicas sum a round in another order than one device;
    # over 8 epochs of Adam that float32 rounding grew to 6e-3 in the weights
    # in 2 of 150 trajectories (one device, rows permuted), in float64 < 1e-14
    return Mlp([64, 64, 10], seed=0, dtype=np.float64)


async def test_a_pinned_cadence_trains_digits_as_one_device_through_fit() -> None:
    # no timing enters a round: quotas 3 and 1 (the hint, not measured), the
    # anchor fixed, so each round is 4 batches of 32, the epoch's last one
    # closed by fit with the 3 left: one device on batches of 128
    x_tr, y_tr, x_te, y_te = DIGITS
    options = _cadence(speed_hint=(3.0, 1.0), cadence_measure_speeds=False)
    async with ActorSystem("cadence") as system:
        dp = await DataParallelTrainer.spawn(system, _digits_model(), cpu_devices(2),
                                             DIGITS_CONFIG, options)  # fmt: skip
        one = await Trainer.spawn(system, _digits_model(), "cpu:0", DIGITS_CONFIG)
        result = await fit(dp, (x_tr, y_tr), validation=(x_te, y_te), epochs=8, batch_size=32)
        reference = await fit(one, (x_tr, y_tr), epochs=8, batch_size=128)
        np.testing.assert_allclose(
            await dp.ask(GetWeights()), await one.ask(GetWeights()), rtol=1e-9, atol=1e-12
        )
    assert result.position.step == reference.position.step == 8 * 11
    assert result.epochs[-1].test_accuracy >= 0.9


class _Rounds(FitCallback):
    """The sample indices of each round `fit` sent (batches of 32, seed 0)."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.rounds: list[np.ndarray] = []
        self._open: list[np.ndarray] = []
        self._last: tuple[int, int] | None = None

    def on_step(self, position: FitPosition, stats: StepStats, mean_loss: float,
                rate: float) -> None:  # fmt: skip
        if (position.epoch, position.batch) != self._last:  # a Step, not a CloseRound
            self._last = (position.epoch, position.batch)
            order = epoch_order(self.rows, 0, position.epoch)
            self._open.append(order[32 * (position.batch - 1) : 32 * position.batch])
        if stats.applied:
            self.rounds.append(np.concatenate(self._open))
            self._open = []


async def test_an_auto_tuned_cadence_trains_digits_as_one_device_on_its_rounds() -> None:
    # the anchor and the quotas follow measured times, so the rounds differ
    # from run to run; whatever they are, each is one step on the union of
    # its batches, and every sample is trained on once an epoch
    x_tr, y_tr, x_te, y_te = DIGITS
    rounds = _Rounds(len(x_tr))
    options = DataParallelOptions(policy=ApplyPolicy.CADENCE)
    async with ActorSystem("cadence") as system:
        dp = await DataParallelTrainer.spawn(system, _digits_model(), cpu_devices(2),
                                             DIGITS_CONFIG, options)  # fmt: skip
        result = await fit(dp, (x_tr, y_tr), validation=(x_te, y_te), epochs=8, batch_size=32,
                           callbacks=[rounds])  # fmt: skip
        one = await Trainer.spawn(system, _digits_model(), "cpu:0", DIGITS_CONFIG)
        for indices in rounds.rounds:
            await one.ask(Step(x_tr[indices], y_tr[indices]))
        np.testing.assert_allclose(
            await dp.ask(GetWeights()), await one.ask(GetWeights()), rtol=1e-9, atol=1e-12
        )
    trained = np.sort(np.concatenate(rounds.rounds))
    np.testing.assert_array_equal(trained, np.repeat(np.arange(len(x_tr)), 8))
    assert result.position.step == len(rounds.rounds)
    # the fewest updates any cadence makes, one round an epoch (one device on
    # the whole set, 8 steps), reach 0.77: learning happened whatever the rounds
    assert result.epochs[-1].test_accuracy >= 0.7


def test_bad_cadence_options_are_refused() -> None:
    with pytest.raises(ValueError, match="cadence_anchor must be >= 1"):
        DataParallelOptions(policy=ApplyPolicy.CADENCE, cadence_anchor=0)
    with pytest.raises(ValueError, match="cadence_target must be in"):
        DataParallelOptions(policy=ApplyPolicy.CADENCE, cadence_target=1.5)
    with pytest.raises(TypeError, match="cadence_auto_tune must be True or False"):
        DataParallelOptions(cadence_auto_tune=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="cadence_measure_speeds must be True or False, got None"):
        DataParallelOptions(cadence_measure_speeds=None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("anchor", "hint"), [(1, (1e300, 1e-300)), (10**400, None), (10**300, (1e10, 1.0))]
)
def test_a_first_quota_beyond_any_number_is_refused(
    anchor: int, hint: tuple[float, ...] | None
) -> None:
    """The fastest replica's first quota, `cadence_anchor` times the hint's
    fastest-to-slowest ratio, is no finite number: before, the options were
    taken and every `Step` answered a bare OverflowError ("cannot convert
    float infinity to integer"), nothing trained. (An anchor beyond
    `INDEX_MAX` is refused first, as a count: `int_at_least`.)"""
    needle = "cadence_anchor (.* no finite number of batches|must be <= 9223372036854775807)"
    with pytest.raises(ValueError, match=needle):
        DataParallelOptions(policy=ApplyPolicy.CADENCE, cadence_anchor=anchor, speed_hint=hint)


class _Sleeper(DeviceActor):
    async def receive(self, message: float) -> float:
        started = time.perf_counter()
        await self.on_device(time.sleep, message)
        return time.perf_counter() - started


async def test_a_slowed_device_takes_factor_times_as_long() -> None:
    # a lower bound that holds on any machine: the job sleeps 10 ms, then the
    # slowed worker sleeps twice that again
    async with ActorSystem("slow") as system:
        slowed = system.spawn(Props(slow_device(_Sleeper, "cpu:1", 3.0), "cpu:1"))
        assert await slowed.ask(0.01) >= 0.03
        # 200x on cpu:1 would make a 1 ms job take >= 0.2 s: other devices and
        # the class itself are untouched
        very_slow = slow_device(_Sleeper, "cpu:1", 200.0)
        assert await system.spawn(Props(very_slow, "cpu:0")).ask(0.001) < 0.15
        assert await system.spawn(Props(_Sleeper, "cpu:1")).ask(0.001) < 0.15


def test_slow_device_is_refused_for_bad_arguments() -> None:
    with pytest.raises(ValueError, match="CPU devices only"):
        slow_device(_Sleeper, "cuda:0", 2.0)
    for factor in (0.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=">= 1"):
            slow_device(_Sleeper, "cpu:1", factor)
    for bad in (True, "3"):  # a bool is no number: the shared rule's TypeError
        with pytest.raises(TypeError, match="factor must be a real number"):
            slow_device(_Sleeper, "cpu:1", bad)  # type: ignore[arg-type]
    assert slow_device(_Sleeper, "cpu:1", np.float32(3)).__name__ == "Slow_Sleeper"
    with pytest.raises(TypeError, match="DeviceActor"):
        slow_device(int, "cpu:1", 2.0)  # type: ignore[type-var]


async def test_a_checkpoint_whose_round_fails_to_close_answers_the_failure(
    tmp_path: Path,
) -> None:
    """The open round is closed before a save (a checkpoint holds every batch
    it was given): a round that failed to close was answered with a saved
    checkpoint, without a word that its batches were dropped."""
    plan = Plan()
    faulty = inject_faults(ReplicaActor, plan, {"compute": ComputeGradients})
    model, path = Mlp([6, 8, 3], seed=0), tmp_path / "round.ckpt"
    props = [Props(ReplicaActor, model, "cpu:0", CONFIG), Props(faulty, model, "cpu:1", CONFIG)]
    async with ActorSystem("cadence") as system:
        dp = system.spawn(DataParallelTrainer.props(CONFIG, props, _cadence(cadence_anchor=50)))
        await dp.ask(Step(*B[0]))
        plan.arm("compute", ValueError)
        await dp.ask(Step(*B[1]))  # dispatched: its failure shows when the round closes
        with pytest.raises(ValueError, match="injected failure"):
            await dp.ask(SaveCheckpoint(str(path)))
        assert not path.exists()
        await dp.ask(SaveCheckpoint(str(path)))  # the round was dropped: nothing left open
        assert path.exists()


async def test_a_round_left_open_at_shutdown_leaves_no_unretrieved_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A service stops with a round open: the round's batches, handed to the
    replicas, failed (the replicas stopped before answering) with nobody to
    close the round, and asyncio logged "Task exception was never retrieved"
    for each."""
    plan = Plan()
    faulty = inject_faults(ReplicaActor, plan, {"compute": ComputeGradients})
    model = Mlp([6, 8, 3], seed=0)
    props = [Props(faulty, model, "cpu:0", CONFIG), Props(faulty, model, "cpu:1", CONFIG)]
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        async with ActorSystem("cadence") as system:
            options = _cadence(cadence_anchor=50)
            dp = system.spawn(DataParallelTrainer.props(CONFIG, props, options))
            plan.arm("compute", None, delay=3600.0, times=2)  # busy until stopped
            for batch in B[:2]:  # one to each replica; the round stays open
                assert not (await dp.ask(Step(*batch))).applied
        del dp, system  # the stopped trainer's last references: collected below
        gc.collect()
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


async def test_set_replicas_closes_the_open_round_first() -> None:
    """New replicas mid-round: the round's batches were computed by the old
    replicas, so it closes on them first. It did not: the next `Step` closed
    it on the new replicas, its old quotas and buffers mixed with their
    weights (silently off the single-device run)."""
    model = Mlp([6, 8, 3], seed=2)
    async with ActorSystem("cadence") as system:
        old = [system.spawn(ReplicaActor.props(model, d, CONFIG)) for d in cpu_devices(2)]
        options = _cadence(cadence_anchor=2, cadence_measure_speeds=False)
        dp = system.spawn(DataParallelTrainer.props(CONFIG, old, options))
        one = await Trainer.spawn(system, model, "cpu:0", CONFIG)
        for b in B[:3]:  # quotas 2 and 2: the round is open
            assert not (await dp.ask(Step(*b))).applied
        await dp.ask(SetReplicas([*old, system.spawn(ReplicaActor.props(model, "cpu:2", CONFIG))]))
        replies = [await dp.ask(Step(*b)) for b in B[3:9]]  # quotas 2, 2 and 2
        assert [r.applied for r in replies] == [False] * 5 + [True]
        for batches in (B[:3], B[3:9]):
            await one.ask(Step(np.concatenate([b[0] for b in batches]),
                               np.concatenate([b[1] for b in batches])))  # fmt: skip
        np.testing.assert_allclose(
            await dp.ask(GetWeights()), await one.ask(GetWeights()), rtol=1e-5, atol=1e-6
        )
