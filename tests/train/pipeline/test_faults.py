"""Fault injection for `PipelineParallelTrainer`: the phases that
tests/train/pipeline/test_trainer.py does not cover (it covers a device
failure in a forward or backward micro-batch and after a full apply).

Here: a failure in the global gradient-norm reduction (`gradient_sq_norm`,
the pipeline's cross-stage reduction before the update), an optimizer dying
with half a stage's weights written, and the stage actor itself crashing
(not its device), which the trainer resumes (its state is intact). Each
time no stage's weights change, the asker gets the typed error, and
training ends where an unfaulted run ends. Last, a stage actor raising
`ContextPoisoned` is restarted and has lost its layers' state: the trainer
refuses with `WorkerStateLost` until a checkpoint is loaded. A stage actor
crashing on a message it was told (`Activations`) fails the step at once,
even without an ask timeout. And a stage crashing while it loads a
checkpoint: every stage keeps (gets back) its state from before the load.

The faults go in through public seams: `atomr.testkit.inject_faults` on the
stage's hooks and messages, the trainer's `stage_class` option.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atomr import ActorRef, ActorSystem
from atomr.accel import ContextPoisoned, cpu_devices
from atomr.testkit import Plan, inject_faults
from atomr.train import (
    GetWeights,
    LoadCheckpoint,
    LossKind,
    Mlp,
    OptimizerKind,
    PipelineParallelTrainer,
    SaveCheckpoint,
    Step,
    Trainer,
    TrainerConfig,
)
from atomr.train.pipeline import PipelineOptions, StageActor
from atomr.train.pipeline.messages import Activations, RunMicroBatches, SetStageState
from tests.reliability.faults import (
    CLASSES,
    IN,
    T,
    assert_a_late_read_is_not_trained,
    assert_same_training,
    assert_unchanged,
    batches,
    clean_run,
    dying_optimizer,
    faulted_run,
    lost_until_reloaded,
    noting,
)

SIZES = [IN, 8, 8, CLASSES]
FAULTY = 1
CONFIG = TrainerConfig(OptimizerKind.adam(0.05), LossKind.CROSS_ENTROPY)

PLACES: dict[str, str | type] = {
    "grad_norm": "gradient_sq_norm",  # the norm reduction before the update
    "actor_crash": RunMicroBatches,  # the actor itself, when a step starts (resumed)
    "context_poisoned": RunMicroBatches,  # the same, as a lost device context (restarted)
    "crash_on_tell": Activations,  # no ask to answer with it
    "load_crash": SetStageState,  # the other stages load meanwhile
}
"""Where stage `FAULTY`'s phases fail (`inject_faults`); "mid_optimizer"
writes half the update first (`dying_optimizer`)."""


async def _spawn(system: ActorSystem, plan: Plan, config: TrainerConfig = CONFIG) -> Any:
    stage_class = inject_faults(StageActor, plan, PLACES, worker=FAULTY)
    options = PipelineOptions(
        6, "1f1b", stage_class=dying_optimizer(stage_class, plan, worker=FAULTY)
    )
    return await PipelineParallelTrainer.spawn(
        system, Mlp(SIZES, seed=5), cpu_devices(3), config, options
    )


async def _weights(pipe: Any) -> np.ndarray:
    """Every stage's weights (`GetWeights` asks each stage for its own)."""
    return await pipe.ask(GetWeights(), timeout=T)


async def _check(system: ActorSystem, phase: str, error_type: type[Exception]) -> None:
    plan = Plan()
    data = batches()
    pipe = await _spawn(system, plan)
    error, views = await faulted_run(pipe, data, plan, phase, lambda: _weights(pipe), error_type)
    assert isinstance(error, error_type) and "injected" in str(error), repr(error)
    assert plan.fired == [phase]
    assert_unchanged(views)
    clean = await _spawn(system, Plan())
    await clean_run(clean, data)
    accuracy = await assert_same_training(pipe, clean)
    print(f"\n{phase}: {type(error).__name__}; accuracy after recovery {accuracy:.3f}")


@pytest.mark.parametrize("phase", ["grad_norm", "mid_optimizer"])
async def test_a_device_fault_changes_no_stage(actor_system: ActorSystem, phase: str) -> None:
    await _check(actor_system, phase, ContextPoisoned)


async def test_a_crashed_stage_actor_is_resumed_and_training_continues(
    actor_system: ActorSystem,
) -> None:
    await _check(actor_system, "actor_crash", RuntimeError)


async def test_a_poisoned_stage_context_refuses_until_a_checkpoint_is_loaded(
    actor_system: ActorSystem, tmp_path: Path
) -> None:
    plan = Plan()
    pipe = await _spawn(actor_system, plan)
    single = await Trainer.spawn(actor_system, Mlp(SIZES, seed=5), "cpu:0", CONFIG)
    await lost_until_reloaded(
        pipe, single, batches(), plan, "context_poisoned", "stage", FAULTY, tmp_path
    )


async def test_a_stage_crashing_on_a_told_message_fails_the_step_at_once(
    actor_system: ActorSystem,
) -> None:
    plan = Plan()
    data = batches()
    forever = dataclasses.replace(CONFIG, worker_timeout=None)  # only the crash can end the step
    pipe = await _spawn(actor_system, plan, forever)
    run = faulted_run(pipe, data, plan, "crash_on_tell", lambda: _weights(pipe), RuntimeError)
    error, views = await asyncio.wait_for(run, 10)
    assert isinstance(error, RuntimeError) and "injected" in str(error), repr(error)
    assert plan.fired == ["crash_on_tell"]
    assert_unchanged(views)
    clean = await _spawn(actor_system, Plan())
    await clean_run(clean, data)
    await assert_same_training(pipe, clean)


async def test_a_stage_crashing_mid_load_leaves_every_stage_as_before_the_load(
    actor_system: ActorSystem, tmp_path: Path
) -> None:
    plan = Plan()
    data = batches()
    pipe = await _spawn(actor_system, plan)
    clean = await _spawn(actor_system, Plan())
    for i, (x, y) in enumerate(data[:2]):
        for trainer in (pipe, clean):
            await trainer.ask(Step(x, y), timeout=T)
        if i == 0:
            await pipe.ask(SaveCheckpoint(tmp_path / "old.ckpt"), timeout=T)
    before = await _weights(pipe)
    plan.arm("load_crash", RuntimeError)
    with pytest.raises(RuntimeError, match="injected") as failed:
        await pipe.ask(LoadCheckpoint(tmp_path / "old.ckpt"), timeout=T)
    assert plan.fired == ["load_crash"]
    assert getattr(failed.value, "worker_index", None) == FAULTY
    notes = " ".join(getattr(failed.value, "__notes__", []))
    assert f"stage {FAULTY} failed to load" in notes and "every stage was given back" in notes
    np.testing.assert_array_equal(await _weights(pipe), before)
    for x, y in data[2:]:  # optimizer state and step count as before the load
        for trainer in (pipe, clean):
            await trainer.ask(Step(x, y), timeout=T)
    await assert_same_training(pipe, clean, atol=0.0)


async def test_a_batch_refilled_after_its_timed_out_step_answers_is_not_trained() -> None:
    """The first stage gets views of the `Step`'s features (its
    micro-batches), the last of its labels. The first stage held past
    `worker_timeout` reads them after the `Step` answered `AskTimeoutError`
    (every stage was sent `AbortStep`) and the sender refilled them, but
    what it computes is never applied (`ApplyStageGradients` is sent only
    once every stage answered the pass, which the abort ended), so no copy
    is needed."""
    plan, notes = Plan(), list[Any]()
    noted = noting(StageActor, RunMicroBatches, 0, notes)
    stage = inject_faults(noted, plan, {"held": RunMicroBatches}, worker=0)
    options = PipelineOptions(micro_batch_size=8, stage_class=stage)

    async def spawn(system: ActorSystem, config: TrainerConfig) -> ActorRef:
        model = Mlp([IN, 8, CLASSES], seed=2)
        return await PipelineParallelTrainer.spawn(system, model, cpu_devices(2), config, options)

    await assert_a_late_read_is_not_trained(spawn, plan, notes, batches(3))
