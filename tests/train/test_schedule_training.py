"""A learning-rate schedule under every strategy: each equals the
single-device Trainer with the same schedule step for step, and a checkpoint
saved mid-schedule resumes it exactly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atomr import ActorSystem
from atomr.accel import cpu_devices
from atomr.train import (
    GetWeights,
    LoadCheckpoint,
    LossKind,
    Mlp,
    OptimizerKind,
    SaveCheckpoint,
    SetLearningRate,
    Step,
    Trainer,
    TrainerConfig,
)
from atomr.train.core import synthetic_classification
from atomr.train.core.schedule import CosineAnnealingLR, LinearLR, SequentialLR
from tests.train.test_contract import STRATEGIES

SCHEDULE = SequentialLR((LinearLR(0.1, 1.0, 3), CosineAnnealingLR(6, 0.001)), (3,))
CONFIG = TrainerConfig(
    OptimizerKind.sgd(0.2, momentum=0.9), LossKind.CROSS_ENTROPY, schedule=SCHEDULE
)
STEPS = 9


def _batches() -> list[tuple[np.ndarray, np.ndarray]]:
    x, y = synthetic_classification(STEPS * 16, 6, 3, seed=4)
    return [(x[i : i + 16], y[i : i + 16]) for i in range(0, len(y), 16)]


async def _run(system: ActorSystem, trainer_class: Any, options: Any, n: int) -> list[Any]:
    ref = await trainer_class.spawn(
        system, Mlp([6, 16, 3], seed=0), cpu_devices(n), CONFIG, options
    )
    losses = [(await ref.ask(Step(x, y))).loss for x, y in _batches()]
    weights = await ref.ask(GetWeights())
    await ref.stop()
    return [losses, weights]


@pytest.mark.parametrize("strategy", [s for s in STRATEGIES if s != "single"])
async def test_every_strategy_follows_the_schedule_as_one_device_does(strategy: str) -> None:
    trainer_class, options, n = STRATEGIES[strategy]
    async with ActorSystem("schedule") as system:
        (ref_losses, ref_weights) = await _run(system, Trainer, None, 1)
        (losses, weights) = await _run(system, trainer_class, options, n)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(weights, ref_weights, rtol=1e-4, atol=1e-5)


async def test_the_schedule_changes_the_result() -> None:
    # the oracle above would pass if every trainer ignored the schedule alike
    constant = TrainerConfig(OptimizerKind.sgd(0.2, momentum=0.9), LossKind.CROSS_ENTROPY)
    async with ActorSystem("schedule") as system:
        scheduled = await Trainer.spawn(system, Mlp([6, 16, 3], seed=0), "cpu:0", CONFIG)
        plain = await Trainer.spawn(system, Mlp([6, 16, 3], seed=0), "cpu:0", constant)
        for x, y in _batches()[:2]:
            await scheduled.ask(Step(x, y))
            await plain.ask(Step(x, y))
        a, b = await scheduled.ask(GetWeights()), await plain.ask(GetWeights())
    assert not np.allclose(a, b)


async def test_a_checkpoint_saved_mid_schedule_resumes_it_exactly(tmp_path: Path) -> None:
    batches = _batches()
    async with ActorSystem("schedule") as system:
        unbroken = await Trainer.spawn(system, Mlp([6, 16, 3], seed=0), "cpu:0", CONFIG)
        for x, y in batches:
            await unbroken.ask(Step(x, y))
        first = await Trainer.spawn(system, Mlp([6, 16, 3], seed=0), "cpu:0", CONFIG)
        for x, y in batches[:4]:
            await first.ask(Step(x, y))
        await first.ask(SaveCheckpoint(tmp_path / "mid.ckpt"))
        # a fresh trainer whose own config has no schedule: the checkpoint's rules
        plain = TrainerConfig(OptimizerKind.sgd(0.2, momentum=0.9), LossKind.CROSS_ENTROPY)
        resumed = await Trainer.spawn(system, Mlp([6, 16, 3], seed=9), "cpu:0", plain)
        await resumed.ask(LoadCheckpoint(tmp_path / "mid.ckpt"))
        for x, y in batches[4:]:
            await resumed.ask(Step(x, y))
        expected, got = await unbroken.ask(GetWeights()), await resumed.ask(GetWeights())
    np.testing.assert_array_equal(got, expected)


async def _set_rate_run(system: ActorSystem, trainer_class: Any, options: Any, n: int) -> Any:
    config = TrainerConfig(OptimizerKind.adam(0.01), LossKind.CROSS_ENTROPY)
    ref = await trainer_class.spawn(
        system, Mlp([6, 16, 3], seed=0), cpu_devices(n), config, options
    )
    batches = _batches()
    for x, y in batches[:3]:
        await ref.ask(Step(x, y))
    with pytest.raises(ValueError, match="lr"):
        await ref.ask(SetLearningRate(float("nan")))  # refused everywhere: nothing changed
    with pytest.raises(TypeError, match="lr must be a real number"):
        await ref.ask(SetLearningRate("0.1"))  # type: ignore[arg-type]
    await ref.ask(SetLearningRate(0.001))
    for x, y in batches[3:6]:
        await ref.ask(Step(x, y))
    weights = await ref.ask(GetWeights())
    await ref.stop()
    return weights


@pytest.mark.parametrize("strategy", list(STRATEGIES))
async def test_set_learning_rate_reaches_every_worker(strategy: str) -> None:
    trainer_class, options, n = STRATEGIES[strategy]
    async with ActorSystem("set-lr") as system:
        got = await _set_rate_run(system, trainer_class, options, n)
        # the reference: one device, the rate changed by hand between steps
        config = TrainerConfig(OptimizerKind.adam(0.01), LossKind.CROSS_ENTROPY)
        ref = await Trainer.spawn(system, Mlp([6, 16, 3], seed=0), "cpu:0", config)
        for k, (x, y) in enumerate(_batches()[:6]):
            if k == 3:
                await ref.ask(SetLearningRate(0.001))
            await ref.ask(Step(x, y))
        expected = await ref.ask(GetWeights())
        # and without the change the weights differ: the message did something
        plain = await Trainer.spawn(system, Mlp([6, 16, 3], seed=0), "cpu:0", config)
        for x, y in _batches()[:6]:
            await plain.ask(Step(x, y))
        unchanged = await plain.ask(GetWeights())
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    assert not np.allclose(expected, unchanged, rtol=1e-4, atol=1e-5)
