"""`ApplyPolicy.ASYNC` (local SGD): each replica steps by its own shard, the
weights are averaged every `average_every` steps (or `average_seconds`), after which the replicas
are identical; with plain SGD, averaging every step and equal shards it is the
synchronous step; it trains digits; bad combinations are refused."""

from __future__ import annotations

import numpy as np
import pytest

from atomr import ActorSystem
from atomr.accel import cpu_devices
from atomr.train import (
    GetWeights,
    LossKind,
    Mlp,
    OptimizerKind,
    Step,
    TrainerConfig,
    fit,
    load_digits_split,
    synthetic_classification,
)
from atomr.train.data_parallel import (
    ApplyPolicy,
    DataParallelOptions,
    DataParallelTrainer,
    GetReplicaWeights,
)

X, Y = synthetic_classification(96, 6, 3, seed=2)
ASYNC = DataParallelOptions(policy=ApplyPolicy.ASYNC, average_every=3)


async def test_replicas_are_identical_after_each_averaging_round_only() -> None:
    config = TrainerConfig(OptimizerKind.adam(0.01), LossKind.CROSS_ENTROPY, gradient_clip=1.0)
    async with ActorSystem("local-sgd") as system:
        dp = await DataParallelTrainer.spawn(system, Mlp([6, 8, 3]), cpu_devices(2), config, ASYNC)
        identical = []
        for k in range(6):
            stats = await dp.ask(Step(X[16 * k : 16 * k + 16], Y[16 * k : 16 * k + 16]))
            assert stats.applied and stats.samples == 16
            a, b = await dp.ask(GetReplicaWeights())
            identical.append(bool(np.array_equal(a, b)))
    assert identical == [False, False, True, False, False, True]


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


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), True, "1"])
def test_bad_average_seconds_are_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="average_seconds"):
        DataParallelOptions(policy=ApplyPolicy.ASYNC, average_seconds=bad)  # type: ignore[arg-type]


async def test_plain_sgd_averaged_every_step_equals_the_synchronous_step() -> None:
    config = TrainerConfig(OptimizerKind.sgd(0.2), LossKind.CROSS_ENTROPY)
    every_step = DataParallelOptions(policy=ApplyPolicy.ASYNC, average_every=1)
    async with ActorSystem("local-sgd") as system:
        local = await DataParallelTrainer.spawn(system, Mlp([6, 8, 3]), cpu_devices(2), config,
                                                every_step)  # fmt: skip
        sync = await DataParallelTrainer.spawn(system, Mlp([6, 8, 3]), cpu_devices(2), config)
        for k in range(5):
            batch = (X[16 * k : 16 * k + 16], Y[16 * k : 16 * k + 16])
            await local.ask(Step(*batch))
            await sync.ask(Step(*batch))
        np.testing.assert_allclose(
            await local.ask(GetWeights()), await sync.ask(GetWeights()), rtol=1e-5, atol=1e-6
        )


async def test_local_sgd_trains_digits() -> None:
    x_tr, y_tr, x_te, y_te = load_digits_split(seed=0)
    config = TrainerConfig(OptimizerKind.adam(0.005), LossKind.CROSS_ENTROPY)
    async with ActorSystem("local-sgd") as system:
        dp = await DataParallelTrainer.spawn(system, Mlp([64, 64, 10], seed=0), cpu_devices(2),
                                             config, ASYNC)  # fmt: skip
        result = await fit(dp, (x_tr, y_tr), validation=(x_te, y_te), epochs=8, batch_size=32)
    # deterministic (the rounds are synchronous): 0.962 here
    assert result.epochs[-1].test_accuracy >= 0.95


def test_bad_combinations_are_refused() -> None:
    with pytest.raises(ValueError, match="average_every must be >= 1"):
        DataParallelOptions(policy=ApplyPolicy.ASYNC, average_every=0)
    with pytest.raises(ValueError, match="check_every applies to SYNC"):
        DataParallelOptions(policy=ApplyPolicy.ASYNC, check_every=2)
    with pytest.raises(TypeError, match="policy must be an ApplyPolicy"):
        DataParallelOptions(policy="async")  # type: ignore[arg-type]


async def test_async_refuses_accumulation_and_a_batch_smaller_than_the_replicas() -> None:
    accumulating = TrainerConfig(
        OptimizerKind.sgd(0.1), LossKind.CROSS_ENTROPY, accumulation_steps=2
    )
    async with ActorSystem("local-sgd") as system:
        with pytest.raises(ValueError, match="does not accumulate"):
            await DataParallelTrainer.spawn(system, Mlp([6, 8, 3]), cpu_devices(2), accumulating,
                                            ASYNC)  # fmt: skip
        config = TrainerConfig(OptimizerKind.sgd(0.1), LossKind.CROSS_ENTROPY)
        dp = await DataParallelTrainer.spawn(system, Mlp([6, 8, 3]), cpu_devices(2), config, ASYNC)
        before = await dp.ask(GetReplicaWeights())
        with pytest.raises(ValueError, match="a sample for each of the 2 replicas"):
            await dp.ask(Step(X[:1], Y[:1]))
        after = await dp.ask(GetReplicaWeights())
    for a, b in zip(before, after, strict=True):
        np.testing.assert_array_equal(a, b)
