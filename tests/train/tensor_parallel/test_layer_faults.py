"""Faults in tensor parallelism of any model (the layer-rule path), injected
with `atomr.testkit.inject_faults` on `LayerShardActor` through
`TensorParallelOptions.layer_shard_class`: a shard failing mid-pass wakes
the others at once (no wait for the deadline), the asker gets that shard's
own error, no shard changed, and training goes on to end where a run
without that step ends; a failed apply rolls every shard back. A shard late
past the deadline fails its Step only: the trainer waits until it is done
with that pass before the next one."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atomr import ActorRef, ActorSystem
from atomr.accel import cpu_devices
from atomr.actor import AskTimeoutError
from atomr.testkit import Plan, inject_faults
from atomr.train import (
    GetWeights,
    LoadCheckpoint,
    LossKind,
    OptimizerKind,
    SaveCheckpoint,
    Step,
    TensorParallelOptions,
    TensorParallelTrainer,
    Trainer,
    TrainerConfig,
)
from atomr.train.core.model import gpt
from atomr.train.tensor_parallel.layer_messages import ShardCommit, ShardPass, ShardStateSet
from atomr.train.tensor_parallel.layer_shard import LayerShardActor
from tests.reliability.faults import assert_a_late_read_is_not_trained, noting

CONFIG = TrainerConfig(
    OptimizerKind.sgd(0.3, momentum=0.9),
    LossKind.CROSS_ENTROPY,
    gradient_clip=1.0,
    worker_timeout=30.0,
)
"""SGD: the attention key bias's gradient is 0 in exact arithmetic, rounding noise
in float32, which Adam would turn into layout-dependent steps (test_models.py)."""
VOCAB, T = 9, 6


def _model() -> Any:
    return gpt(VOCAB, T, n_layer=1, d_model=8, n_head=2, dropout=0.1, seed=3)


def _data(n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(5)
    w = rng.integers(0, VOCAB, size=(n, 8, T + 1))
    return [(b[:, :-1].copy(), b[:, 1:].copy()) for b in w]


def _faulty(plan: Plan, places: dict[str, Any], worker: int) -> TensorParallelOptions:
    """Options whose layer shard `worker` fails at `places` as `plan` says."""
    faulty = inject_faults(LayerShardActor, plan, places, worker=worker)
    return TensorParallelOptions(layer_shard_class=faulty)


@pytest.mark.parametrize(("phase", "after"), [("pass", False), ("apply", True)])
async def test_a_failing_shard_changes_nothing_and_training_goes_on(
    phase: str, after: bool
) -> None:
    plan = Plan()
    options = _faulty(plan, {"pass": "run_pass", "apply": "apply"}, 1)
    data = _data(5)
    async with ActorSystem("tp-faults") as system:
        tp = await TensorParallelTrainer.spawn(system, _model(), cpu_devices(2), CONFIG, options)
        one = await Trainer.spawn(system, _model(), ["cpu:0"], CONFIG)
        for i, (x, y) in enumerate(data):
            if i == 2:
                before = await tp.ask(GetWeights())
                plan.arm(phase, RuntimeError, after=after)
                started = time.perf_counter()
                with pytest.raises(Exception, match="injected failure"):
                    await tp.ask(Step(x, y))
                assert time.perf_counter() - started < 10  # not the 30 s deadline
                np.testing.assert_array_equal(await tp.ask(GetWeights()), before)
                continue
            await tp.ask(Step(x, y))
            await one.ask(Step(x, y))
        assert plan.fired == [phase]
        np.testing.assert_allclose(
            await tp.ask(GetWeights()), await one.ask(GetWeights()), rtol=2e-4, atol=2e-6
        )


@pytest.mark.parametrize("late", [0, 1])
async def test_a_shard_late_past_the_deadline_fails_its_step_only(late: int) -> None:
    """Shard `late` starts a pass after the other gave up waiting for it: that
    Step fails and changes nothing; the next one succeeds (the late pass is
    not paired with its data), and the shards equal one device trained on
    the steps that succeeded."""
    timeout = 1.0
    config = dataclasses.replace(CONFIG, worker_timeout=timeout)
    plan = Plan()
    options = _faulty(plan, {"pass": "run_pass"}, late)
    async with ActorSystem("tp-late") as system:
        tp = await TensorParallelTrainer.spawn(system, _model(), cpu_devices(2), config, options)
        one = await Trainer.spawn(system, _model(), ["cpu:0"], config)
        for i, (x, y) in enumerate(_data(5)):
            if i == 1:
                before = await tp.ask(GetWeights())
                plan.arm("pass", None, delay=1.5 * timeout)
                with pytest.raises(AskTimeoutError) as failed:
                    await tp.ask(Step(x, y), timeout=30)
                assert "no shard changed its weights" in " ".join(failed.value.__notes__)
                np.testing.assert_array_equal(await tp.ask(GetWeights()), before)
                continue
            await tp.ask(Step(x, y), timeout=30)
            await one.ask(Step(x, y))
        assert plan.fired == ["pass"]
        np.testing.assert_allclose(
            await tp.ask(GetWeights()), await one.ask(GetWeights()), rtol=2e-4, atol=2e-6
        )


async def test_a_shard_failing_to_load_a_checkpoint_leaves_every_shard_as_before(
    tmp_path: Path,
) -> None:
    """Shard 1 crashes on its part of a checkpoint while shard 0 loads its own:
    the asker gets shard 1's error, every shard keeps (gets back) its weights,
    optimizer state and step count, and training goes on as if no load was
    asked."""
    plan = Plan()
    options = _faulty(plan, {"load": ShardStateSet}, 1)
    data = _data(4)
    async with ActorSystem("tp-load") as system:
        tp = await TensorParallelTrainer.spawn(system, _model(), cpu_devices(2), CONFIG, options)
        one = await Trainer.spawn(system, _model(), ["cpu:0"], CONFIG)
        for i, (x, y) in enumerate(data[:2]):
            await tp.ask(Step(x, y))
            await one.ask(Step(x, y))
            if i == 0:
                await tp.ask(SaveCheckpoint(tmp_path / "old.ckpt"))
        before = await tp.ask(GetWeights())
        plan.arm("load", RuntimeError)
        with pytest.raises(RuntimeError, match="injected failure") as failed:
            await tp.ask(LoadCheckpoint(tmp_path / "old.ckpt"))
        assert plan.fired == ["load"]
        assert getattr(failed.value, "worker_index", None) == 1
        assert "every shard was given back" in " ".join(failed.value.__notes__)
        np.testing.assert_array_equal(await tp.ask(GetWeights()), before)
        for x, y in data[2:]:  # momentum and step count (dropout) as before the load
            await tp.ask(Step(x, y))
            await one.ask(Step(x, y))
        np.testing.assert_allclose(
            await tp.ask(GetWeights()), await one.ask(GetWeights()), rtol=2e-4, atol=2e-6
        )


async def test_a_shard_actor_crashing_on_its_pass_wakes_the_others_at_once() -> None:
    """Shard 1's actor raises on `ShardPass` before its pass starts (it is
    resumed), so it never meets shard 0 mid-pass: shard 0 must be woken at
    once, not wait forever (no deadline here); the asker gets shard 1's own
    error, nothing changed, and training goes on."""
    config = dataclasses.replace(CONFIG, worker_timeout=None)
    plan = Plan()
    options = _faulty(plan, {"crash": ShardPass}, 1)
    data = _data(4)
    async with ActorSystem("tp-crash") as system:
        tp = await TensorParallelTrainer.spawn(system, _model(), cpu_devices(2), config, options)
        one = await Trainer.spawn(system, _model(), ["cpu:0"], config)
        for i, (x, y) in enumerate(data):
            if i == 1:
                before = await tp.ask(GetWeights())
                plan.arm("crash", RuntimeError)
                with pytest.raises(RuntimeError, match="injected failure") as failed:
                    await asyncio.wait_for(tp.ask(Step(x, y), timeout=None), 60)
                assert getattr(failed.value, "worker_index", None) == 1
                np.testing.assert_array_equal(await tp.ask(GetWeights()), before)
                continue
            await tp.ask(Step(x, y))
            await one.ask(Step(x, y))
        assert plan.fired == ["crash"]
        np.testing.assert_allclose(
            await tp.ask(GetWeights()), await one.ask(GetWeights()), rtol=2e-4, atol=2e-6
        )


async def test_a_shard_failing_its_commit_does_not_fail_an_applied_step() -> None:
    """Every shard applied; shard 1's actor then raises on `ShardCommit`. The
    new weights are already current on every shard, so the step counts as
    done (it cannot be undone on the shards that committed): the trainer
    stays equal to one device trained on every step."""
    plan = Plan()
    options = _faulty(plan, {"commit": ShardCommit}, 1)
    async with ActorSystem("tp-commit") as system:
        tp = await TensorParallelTrainer.spawn(system, _model(), cpu_devices(2), CONFIG, options)
        one = await Trainer.spawn(system, _model(), ["cpu:0"], CONFIG)
        for i, (x, y) in enumerate(_data(4)):
            if i == 1:
                plan.arm("commit", RuntimeError)
            await tp.ask(Step(x, y))
            await one.ask(Step(x, y))
        assert plan.fired == ["commit"]
        np.testing.assert_allclose(
            await tp.ask(GetWeights()), await one.ask(GetWeights()), rtol=2e-4, atol=2e-6
        )


async def test_a_batch_refilled_after_its_timed_out_step_answers_is_not_trained() -> None:
    """Every shard gets the `Step`'s arrays themselves. A shard held past
    `worker_timeout` on its pass reads them after the `Step` answered
    `AskTimeoutError` and the sender refilled them, but its pass changes no
    weight and meets an aborted group, and the apply is sent only once every
    shard answered its pass, so no copy is needed."""
    plan, notes = Plan(), list[Any]()
    noted = noting(LayerShardActor, ShardPass, 1, notes)
    options = TensorParallelOptions(
        layer_shard_class=inject_faults(noted, plan, {"held": ShardPass}, worker=1)
    )

    async def spawn(system: ActorSystem, config: TrainerConfig) -> ActorRef:
        return await TensorParallelTrainer.spawn(system, _model(), cpu_devices(2), config, options)

    await assert_a_late_read_is_not_trained(spawn, plan, notes, _data(3))
