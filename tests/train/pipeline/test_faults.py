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
even without an ask timeout.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atomr import ActorSystem
from atomr.accel import ContextPoisoned, cpu_devices
from atomr.train import (
    LossKind,
    Mlp,
    OptimizerKind,
    PipelineParallelTrainer,
    Trainer,
    TrainerConfig,
)
from atomr.train.pipeline import PipelineOptions, StageActor
from atomr.train.pipeline.messages import Activations, GetStageWeights, RunMicroBatches
from tests.reliability.faults import (
    CLASSES,
    IN,
    Plan,
    T,
    assert_same_training,
    assert_unchanged,
    batches,
    clean_run,
    faulted_run,
    lost_until_reloaded,
)

SIZES = [IN, 8, 8, CLASSES]
FAULTY = 1
CONFIG = TrainerConfig(OptimizerKind.adam(0.05), LossKind.CROSS_ENTROPY)


class FaultyStage(StageActor):
    """Stage 1 fails where its plan says."""

    plan: Plan = Plan()

    def gradient_sq_norm(self) -> float:
        """Fail in the norm reduction."""
        if self.index == FAULTY:
            self.plan.fire("grad_norm")
        return super().gradient_sq_norm()

    def apply_gradients(self, step_id: int, coef: float) -> None:
        """Fail with half the stage's weights written."""
        opt = self.optimizer
        if self.index != FAULTY or opt is None or not self.plan.due("mid_optimizer"):
            return super().apply_gradients(step_id, coef)

        def broken(params: Any, grads: Any, params_out: Any, spare: Any) -> None:
            params_out[: params_out.shape[0] // 2] -= 0.5
            raise ContextPoisoned("injected failure: mid_optimizer")

        opt.step_into = broken  # type: ignore[method-assign]
        try:
            return super().apply_gradients(step_id, coef)
        finally:
            del opt.step_into

    async def receive(self, message: Any) -> Any:
        """Crash the actor itself when a step starts."""
        if isinstance(message, RunMicroBatches) and message.train and self.index == FAULTY:
            self.plan.fire("actor_crash", RuntimeError)
            self.plan.fire("context_poisoned")  # the same, as a lost device context
        if isinstance(message, Activations) and self.index == FAULTY:
            self.plan.fire("crash_on_tell", RuntimeError)  # no ask to answer with it
        return await super().receive(message)


async def _spawn(system: ActorSystem, plan: Plan, config: TrainerConfig = CONFIG) -> Any:
    stage_class = type("PlannedStage", (FaultyStage,), {"plan": plan})
    options = PipelineOptions(6, "1f1b", stage_class=stage_class)
    return await PipelineParallelTrainer.spawn(
        system, Mlp(SIZES, seed=5), cpu_devices(3), config, options
    )


async def _stage_weights(pipe: Any) -> list[np.ndarray]:
    stages = pipe._cell.instance.stages  # white-box: ask each stage for its own weights
    return [await s.ask(GetStageWeights(), timeout=T) for s in stages]


async def _check(system: ActorSystem, phase: str, error_type: type[Exception]) -> None:
    plan = Plan()
    data = batches()
    pipe = await _spawn(system, plan)
    error, views = await faulted_run(pipe, data, plan, phase, lambda: _stage_weights(pipe))
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
    run = faulted_run(pipe, data, plan, "crash_on_tell", lambda: _stage_weights(pipe))
    error, views = await asyncio.wait_for(run, 10)
    assert isinstance(error, RuntimeError) and "injected" in str(error), repr(error)
    assert plan.fired == ["crash_on_tell"]
    assert_unchanged(views)
    clean = await _spawn(actor_system, Plan())
    await clean_run(clean, data)
    await assert_same_training(pipe, clean)
