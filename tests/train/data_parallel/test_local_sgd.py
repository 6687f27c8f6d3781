"""`ApplyPolicy.ASYNC` (local SGD): each batch goes whole to one replica,
which steps by it with its own optimizer; the weights are averaged every
`average_every` batches (or `average_seconds`), after which the replicas are
identical; with plain SGD and one batch per replica it is the synchronous step
on the round's batches; a slow replica does not hold the others back; it
trains digits; a failed local step is answered; bad combinations are refused."""

from __future__ import annotations

import time

import numpy as np
import pytest

from atomr import ActorSystem, Props
from atomr.accel import DriverError, cpu_devices
from atomr.testkit import ManualClock, Plan, inject_faults
from atomr.train import (
    Evaluate,
    GetWeights,
    InvalidBatchError,
    LoadCheckpoint,
    LossKind,
    Mlp,
    NonFiniteError,
    OptimizerKind,
    SaveCheckpoint,
    Step,
    Trainer,
    TrainerConfig,
    fit,
)
from atomr.train.core import GetTrainingState, load_digits_split, synthetic_classification
from atomr.train.core.errors import StepLimitError
from atomr.train.data_parallel import (
    ApplyPolicy,
    DataParallelOptions,
    DataParallelTrainer,
    GetReplicaWeights,
    ReplicaActor,
)

from .feed_clock import FeedClock, feed, timed_replica

X, Y = synthetic_classification(96, 6, 3, seed=2)
ASYNC = DataParallelOptions(policy=ApplyPolicy.ASYNC, average_every=3)


async def test_replicas_are_identical_after_each_averaging_round_only() -> None:
    config = TrainerConfig(OptimizerKind.adam(0.01), LossKind.CROSS_ENTROPY, gradient_clip=1.0)
    async with ActorSystem("local-sgd") as system:
        dp = await DataParallelTrainer.spawn(system, Mlp([6, 8, 3]), cpu_devices(2), config, ASYNC)
        identical, applied = [], []
        for k in range(6):
            stats = await dp.ask(Step(X[16 * k : 16 * k + 16], Y[16 * k : 16 * k + 16]))
            applied.append((stats.applied, stats.samples))
            a, b = await dp.ask(GetReplicaWeights())
            identical.append(bool(np.array_equal(a, b)))
    assert identical == [False, False, True, False, False, True]
    # a round's Step answers for the round's three batches
    assert applied == [(False, 0), (False, 0), (True, 48)] * 2


@pytest.mark.parametrize(("seconds", "expected"), [(1e-9, [True] * 3), (3600.0, [False] * 3)])
async def test_a_round_also_comes_after_average_seconds(
    seconds: float, expected: list[bool]
) -> None:
    # by steps alone no round would come (average_every 1000): only the clock decides
    config = TrainerConfig(OptimizerKind.adam(0.01), LossKind.CROSS_ENTROPY)
    options = DataParallelOptions(
        policy=ApplyPolicy.ASYNC, average_every=1000, average_seconds=seconds
    )
    async with ActorSystem("local-sgd") as system:
        dp = await DataParallelTrainer.spawn(
            system, Mlp([6, 8, 3]), cpu_devices(2), config, options
        )
        identical = []
        for k in range(3):
            await dp.ask(Step(X[16 * k : 16 * k + 16], Y[16 * k : 16 * k + 16]))
            a, b = await dp.ask(GetReplicaWeights())
            identical.append(bool(np.array_equal(a, b)))
    assert identical == expected


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        (0, ValueError),
        (-1.0, ValueError),
        (float("nan"), ValueError),
        (float("inf"), ValueError),
        (True, TypeError),
        ("1", TypeError),
    ],
)
def test_bad_average_seconds_are_refused(bad: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="average_seconds"):
        DataParallelOptions(policy=ApplyPolicy.ASYNC, average_seconds=bad)  # type: ignore[arg-type]


async def test_plain_sgd_with_one_batch_per_replica_is_the_synchronous_step() -> None:
    # one round of two batches: each replica steps by one batch from the same
    # weights, and their mean is one synchronous step on both batches
    config = TrainerConfig(OptimizerKind.sgd(0.2), LossKind.CROSS_ENTROPY)
    per_replica = DataParallelOptions(policy=ApplyPolicy.ASYNC, average_every=2)
    async with ActorSystem("local-sgd") as system:
        local = await DataParallelTrainer.spawn(system, Mlp([6, 8, 3]), cpu_devices(2), config,
                                                per_replica)  # fmt: skip
        sync = await DataParallelTrainer.spawn(system, Mlp([6, 8, 3]), cpu_devices(2), config)
        await local.ask(Step(X[:16], Y[:16]))
        stats = await local.ask(Step(X[16:32], Y[16:32]))
        await sync.ask(Step(X[:32], Y[:32]))
        assert stats.applied and stats.samples == 32
        np.testing.assert_allclose(
            await local.ask(GetWeights()), await sync.ask(GetWeights()), rtol=1e-5, atol=1e-6
        )


async def test_one_replica_is_the_single_device_trainer() -> None:
    config = TrainerConfig(OptimizerKind.adam(0.01), LossKind.CROSS_ENTROPY)
    async with ActorSystem("local-sgd") as system:
        local = await DataParallelTrainer.spawn(system, Mlp([6, 8, 3]), cpu_devices(1), config,
                                                ASYNC)  # fmt: skip
        single = await Trainer.spawn(system, Mlp([6, 8, 3]), "cpu:0", config)
        for k in range(5):
            batch = (X[16 * k : 16 * k + 16], Y[16 * k : 16 * k + 16])
            await local.ask(Step(*batch))
            await single.ask(Step(*batch))
        np.testing.assert_array_equal(await local.ask(GetWeights()), await single.ask(GetWeights()))


class CountingReplica(ReplicaActor):
    """Appends its index to `log` for every batch it computes, after sleeping
    `delay` seconds (a slow device)."""

    def __init__(self, model, device, config, index: int, log: list[int], delay: float = 0.0):
        super().__init__(model, device, config)
        self.index, self.log, self.delay = index, log, delay

    def compute_gradients(self, msg):
        time.sleep(self.delay)
        self.log.append(self.index)
        return super().compute_gradients(msg)


async def test_a_slow_replica_does_not_hold_the_others_back() -> None:
    config = TrainerConfig(OptimizerKind.sgd(0.1), LossKind.CROSS_ENTROPY)
    options = DataParallelOptions(policy=ApplyPolicy.ASYNC, average_every=12)
    model, log = Mlp([6, 8, 3]), []
    props = [
        Props(CountingReplica, model, dev, config, k, log, delay=0.05 * k)
        for k, dev in enumerate(cpu_devices(2))
    ]
    async with ActorSystem("local-sgd") as system:
        dp = system.spawn(DataParallelTrainer.props(config, props, options))
        answers = [
            await dp.ask(Step(X[8 * k : 8 * k + 8], Y[8 * k : 8 * k + 8])) for k in range(12)
        ]
        a, b = await dp.ask(GetReplicaWeights())
    np.testing.assert_array_equal(a, b)  # the twelfth Step closed the round
    assert [s.applied for s in answers] == [False] * 11 + [True]
    assert answers[-1].samples == 96
    # the fast replica took the batches the slow one could not: at most two queued there
    assert log.count(0) >= 8 and 1 <= log.count(1) <= 4, log


async def test_equal_replicas_fed_slowly_share_the_batches() -> None:
    # each batch is done before the next comes (exact time): the speeds began
    # as the hint's unitless 1.0 and measured seconds were averaged into them,
    # so the replica measured more often looked faster and took nearly every
    # batch (23 of 24); now the first measurement puts every speed in seconds
    clock = FeedClock()
    config = TrainerConfig(OptimizerKind.sgd(0.1), LossKind.CROSS_ENTROPY)
    options = DataParallelOptions(policy=ApplyPolicy.ASYNC, average_every=4, clock=clock.time,
                                  replica_class=timed_replica(clock, (0.01, 0.01)))  # fmt: skip
    async with ActorSystem("local-sgd") as system:
        dp = await DataParallelTrainer.spawn(system, Mlp([6, 8, 3]), cpu_devices(2), config,
                                             options)  # fmt: skip
        for k in range(24):
            await feed(dp, (X[4 * k : 4 * k + 4], Y[4 * k : 4 * k + 4]), clock, gap=1.0)
    assert clock.batches == [0, 1] * 12


class RefusingReplica(ReplicaActor):
    """Refuses a batch whose first feature is 99, as a non-finite gradient would."""

    def compute_gradients(self, msg):
        if msg.features.shape[0] and msg.features[0, 0] == 99.0:
            raise NonFiniteError("the loss is not finite")
        return super().compute_gradients(msg)


async def test_a_failed_local_step_is_answered_when_its_round_closes() -> None:
    config = TrainerConfig(OptimizerKind.sgd(0.1), LossKind.CROSS_ENTROPY)
    options = DataParallelOptions(policy=ApplyPolicy.ASYNC, average_every=2)
    model = Mlp([6, 8, 3])
    props = [Props(RefusingReplica, model, dev, config) for dev in cpu_devices(2)]
    marked = X[16:32].copy()
    marked[0, 0] = 99.0
    async with ActorSystem("local-sgd") as system:
        dp = system.spawn(DataParallelTrainer.props(config, props, options))
        before = await dp.ask(GetReplicaWeights())
        await dp.ask(Step(X[:16], Y[:16]))  # replica 0 steps
        with pytest.raises(NonFiniteError) as raised:
            await dp.ask(Step(marked, Y[16:32]))  # replica 1 refuses; the round closes
        assert "replica 1; the round was not averaged" in str(raised.value.__notes__)
        a, b = await dp.ask(GetReplicaWeights())
        assert not np.array_equal(a, before[0])  # replica 0's local step stands
        np.testing.assert_array_equal(b, before[1])  # replica 1 unchanged
        await dp.ask(Step(X[32:48], Y[32:48]))
        stats = await dp.ask(Step(X[48:64], Y[48:64]))  # the next round averages
        a, b = await dp.ask(GetReplicaWeights())
    assert stats.applied and stats.samples == 32
    np.testing.assert_array_equal(a, b)


async def test_local_sgd_trains_digits() -> None:
    x_tr, y_tr, x_te, y_te = load_digits_split(seed=0)
    config = TrainerConfig(OptimizerKind.adam(0.005), LossKind.CROSS_ENTROPY)
    async with ActorSystem("local-sgd") as system:
        dp = await DataParallelTrainer.spawn(system, Mlp([64, 64, 10], seed=0), cpu_devices(2),
                                             config, ASYNC)  # fmt: skip
        result = await fit(dp, (x_tr, y_tr), validation=(x_te, y_te), epochs=12, batch_size=32)
    # which replica takes which batch depends on timing: over 8 runs here the
    # last three epochs each gave 0.955-0.964 (the last epoch 0.960-0.962)
    accuracies = [e.test_accuracy for e in result.epochs[-3:]]
    assert max(accuracies) >= 0.95 and accuracies[-1] >= 0.94, accuracies


def test_bad_combinations_are_refused() -> None:
    with pytest.raises(ValueError, match="average_every must be >= 1"):
        DataParallelOptions(policy=ApplyPolicy.ASYNC, average_every=0)
    with pytest.raises(ValueError, match="check_every does not apply to ApplyPolicy.ASYNC"):
        DataParallelOptions(policy=ApplyPolicy.ASYNC, check_every=2)
    with pytest.raises(TypeError, match="policy must be an ApplyPolicy"):
        DataParallelOptions(policy="async")  # type: ignore[arg-type]


async def test_async_refuses_accumulation_and_takes_a_batch_smaller_than_the_replicas() -> None:
    accumulating = TrainerConfig(
        OptimizerKind.sgd(0.1), LossKind.CROSS_ENTROPY, accumulation_steps=2
    )
    async with ActorSystem("local-sgd") as system:
        with pytest.raises(ValueError, match="does not accumulate"):
            await DataParallelTrainer.spawn(system, Mlp([6, 8, 3]), cpu_devices(2), accumulating,
                                            ASYNC)  # fmt: skip
        config = TrainerConfig(OptimizerKind.sgd(0.1), LossKind.CROSS_ENTROPY)
        dp = await DataParallelTrainer.spawn(system, Mlp([6, 8, 3]), cpu_devices(2), config, ASYNC)
        for k in range(3):  # a batch goes whole to one replica: one row is enough
            stats = await dp.ask(Step(X[k : k + 1], Y[k : k + 1]))
        a, b = await dp.ask(GetReplicaWeights())
    assert stats.applied and stats.samples == 3
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("closer", ["save", "evaluate", "weights"])
async def test_a_checkpoint_an_evaluation_or_the_weights_close_the_open_round(
    closer: str, tmp_path
) -> None:
    config = TrainerConfig(OptimizerKind.adam(0.01), LossKind.CROSS_ENTROPY)
    options = DataParallelOptions(policy=ApplyPolicy.ASYNC, average_every=100)
    async with ActorSystem("local-sgd") as system:
        dp = await DataParallelTrainer.spawn(
            system, Mlp([6, 8, 3]), cpu_devices(2), config, options
        )
        for k in range(3):
            await dp.ask(Step(X[16 * k : 16 * k + 16], Y[16 * k : 16 * k + 16]))
        a, b = await dp.ask(GetReplicaWeights())
        assert not np.array_equal(a, b)  # the round is still open
        mean = ((a.astype(np.float64) + b) / 2).astype(np.float32)
        if closer == "save":
            await dp.ask(SaveCheckpoint(tmp_path / "c.npz"))
            single = await Trainer.spawn(system, Mlp([6, 8, 3]), "cpu:0", config)
            await single.ask(LoadCheckpoint(tmp_path / "c.npz"))
            np.testing.assert_array_equal(await single.ask(GetWeights()), mean)
        elif closer == "evaluate":
            await dp.ask(Evaluate(X, Y))
        else:
            np.testing.assert_array_equal(await dp.ask(GetWeights()), mean)
        a, b = await dp.ask(GetReplicaWeights())
    np.testing.assert_array_equal(a, mean)
    np.testing.assert_array_equal(b, mean)


async def test_a_batch_of_weight_zero_is_answered_as_a_bad_request_at_its_round() -> None:
    # its mean gradient is undefined: refused by the replica's local step,
    # which changes nothing, and the replica is not re-synced (not a crash)
    loss = LossKind.weighted_cross_entropy([0.0, 1.0, 1.0])
    config = TrainerConfig(OptimizerKind.sgd(0.1), loss)
    options = DataParallelOptions(policy=ApplyPolicy.ASYNC, average_every=2)
    async with ActorSystem("local-sgd") as system:
        dp = await DataParallelTrainer.spawn(
            system, Mlp([6, 8, 3]), cpu_devices(2), config, options
        )
        before = await dp.ask(GetReplicaWeights())
        await dp.ask(Step(X[:16], np.where(Y[:16] == 0, 1, Y[:16])))  # replica 0 steps
        with pytest.raises(InvalidBatchError, match="class weight 0"):
            await dp.ask(Step(X[16:32], np.zeros(16, dtype=np.int64)))  # replica 1 refuses
        a, b = await dp.ask(GetReplicaWeights())
    assert not np.array_equal(a, before[0])
    np.testing.assert_array_equal(b, before[1])


async def test_a_replica_that_crashes_mid_round_is_resynced_and_the_next_round_averages() -> None:
    # a crash (not a bad request) in replica 1's local step: its supervisor
    # restarts it, the round's close answers the error and copies a healthy
    # replica's state into it; the next round then averages as usual
    plan = Plan()
    faulty = inject_faults(ReplicaActor, plan, {"apply": "apply_gradients"})
    config = TrainerConfig(OptimizerKind.sgd(0.1), LossKind.CROSS_ENTROPY)
    options = DataParallelOptions(policy=ApplyPolicy.ASYNC, average_every=2)
    model = Mlp([6, 8, 3])
    first, second = cpu_devices(2)
    props = [Props(ReplicaActor, model, first, config), Props(faulty, model, second, config)]
    async with ActorSystem("local-sgd") as system:
        dp = system.spawn(DataParallelTrainer.props(config, props, options))
        await dp.ask(GetReplicaWeights())
        plan.arm("apply", RuntimeError)
        await dp.ask(Step(X[:16], Y[:16]))  # replica 0
        with pytest.raises(DriverError, match="injected failure") as raised:
            await dp.ask(Step(X[16:32], Y[16:32]))  # replica 1 crashes
        assert "replica 1; the round was not averaged" in str(raised.value.__notes__)
        a, b = await dp.ask(GetReplicaWeights())
        np.testing.assert_array_equal(a, b)  # re-synced from replica 0
        await dp.ask(Step(X[32:48], Y[32:48]))
        stats = await dp.ask(Step(X[48:64], Y[48:64]))
        a, b = await dp.ask(GetReplicaWeights())
    assert stats.applied and stats.samples == 32
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("fault", ["refused", "crash"])
async def test_local_steps_that_do_not_stand_are_not_counted_against_max_steps(
    fault: str,
) -> None:
    # a clock that never moves: no speed is learnt, so the batches go to
    # replicas 0, 1, 0, 1. Replica 1's second local step fails: refused (its
    # first stands) or crashed (restarted and re-synced: neither stands).
    # Every batch handed out was counted as a step, so the trainer reported
    # 4 steps for 3 (or 2) and refused Steps short of max_steps
    plan = Plan()
    config = TrainerConfig(OptimizerKind.sgd(0.1), LossKind.CROSS_ENTROPY, max_steps=4)
    options = DataParallelOptions(
        policy=ApplyPolicy.ASYNC, average_every=4, clock=ManualClock().time
    )
    model = Mlp([6, 8, 3])
    second = RefusingReplica
    if fault == "crash":
        second = inject_faults(ReplicaActor, plan, {"apply": "apply_gradients"})
        plan.arm("apply", RuntimeError, skip=1)
    first_dev, second_dev = cpu_devices(2)
    props = [
        Props(ReplicaActor, model, first_dev, config),
        Props(second, model, second_dev, config),
    ]
    marked = X[48:64].copy()
    marked[0, 0] = 99.0  # RefusingReplica refuses it
    async with ActorSystem("local-sgd") as system:
        dp = system.spawn(DataParallelTrainer.props(config, props, options))
        for k in range(3):
            await dp.ask(Step(X[16 * k : 16 * k + 16], Y[16 * k : 16 * k + 16]))
        with pytest.raises(Exception, match="replica 1; the round was not averaged"):
            await dp.ask(Step(marked, Y[48:64]))
        stood = 3 if fault == "refused" else 2
        assert (await dp.ask(GetTrainingState())).step == stood
        for _ in range(stood, 4):  # the steps left to the limit are taken, then refused
            await dp.ask(Step(X[:16], Y[:16]))
        with pytest.raises(StepLimitError):
            await dp.ask(Step(X[:16], Y[:16]))
