"""`TrainerConfig.worker_timeout` is every replica reply's deadline in
`ShardedDataParallelTrainer`: a replica stalling past it fails the request
with the replica's own timeout, whatever the message; but a replica whose
commit answers late is waited for, so the step is completed everywhere, or
the error says it was applied."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atomr import ActorSystem, AskTimeoutError
from atomr.accel import cpu_devices
from atomr.testkit import Plan, inject_faults
from atomr.train import (
    Evaluate,
    GetWeights,
    LoadCheckpoint,
    LossKind,
    Mlp,
    OptimizerKind,
    SaveCheckpoint,
    ShardedDataParallelTrainer,
    ShardedOptions,
    Step,
    Trainer,
    TrainerConfig,
)
from atomr.train.core import GetTrainingState, synthetic_classification
from atomr.train.sharded import GetShardMemory, ShardedReplica
from atomr.train.sharded.messages import CommitShard, GetShardState

SLOW = 1
STALL = 3.0  # far beyond worker_timeout, below the asker's own timeout
CONFIG = TrainerConfig(OptimizerKind.sgd(0.1), LossKind.CROSS_ENTROPY, worker_timeout=0.5)
UNHURRIED = replace(CONFIG, worker_timeout=60.0)


async def _warm_up(system: ActorSystem, stage: int) -> None:
    """Run a step, an evaluation and GetWeights once under a generous
    deadline, so that compiling the kernels on first use (numba: seconds on a
    cold cache) never counts against CONFIG's 0.5 s."""
    options = ShardedOptions(stage=stage)
    trainer = await ShardedDataParallelTrainer.spawn(
        system, Mlp([3, 4, 2], seed=0), cpu_devices(2), UNHURRIED, options
    )
    data = synthetic_classification(6, 3, 2, seed=0)
    await trainer.ask(Step(*data), timeout=120)
    await trainer.ask(Evaluate(*data), timeout=120)
    await trainer.ask(GetWeights(), timeout=120)
    await trainer.stop()


async def _spawn(system: ActorSystem, plan: Plan, stage: int = 1) -> Any:
    await _warm_up(system, stage)
    phases: dict[str, str | type] = {
        "state": GetShardState,
        "memory": GetShardMemory,
        "commit": CommitShard,
    }
    slow = inject_faults(ShardedReplica, plan, phases, worker=SLOW)
    options = ShardedOptions(stage=stage, replica_class=slow)
    return await ShardedDataParallelTrainer.spawn(
        system, Mlp([3, 4, 2], seed=0), cpu_devices(2), CONFIG, options
    )


@pytest.mark.parametrize(
    ("phase", "message"),
    [
        ("state", lambda _: GetWeights()),
        ("state", lambda d: SaveCheckpoint(d / "c.ckpt")),
        ("state", lambda d: LoadCheckpoint(d / "c.ckpt")),
        ("memory", lambda _: GetShardMemory()),
    ],
    ids=["GetWeights", "SaveCheckpoint", "LoadCheckpoint", "GetShardMemory"],
)
async def test_a_replica_stalling_past_worker_timeout_fails_the_request(
    phase: str, message: Any, tmp_path: Path
) -> None:
    plan = Plan()
    async with ActorSystem("zero-timeouts") as system:
        trainer = await _spawn(system, plan)
        await trainer.ask(SaveCheckpoint(tmp_path / "c.ckpt"), timeout=30)
        plan.arm(phase, None, delay=STALL)
        with pytest.raises(AskTimeoutError) as caught:
            await trainer.ask(message(tmp_path), timeout=STALL - 1.0)
        assert getattr(caught.value, "worker_index", None) == SLOW  # the replica's own timeout


async def _reference(system: ActorSystem, data: list[Any]) -> tuple[Any, Any]:
    """The weights and the evaluation of the first batch after the steps."""
    one = await Trainer.spawn(system, Mlp([3, 4, 2], seed=0), ["cpu:0"], UNHURRIED)
    for x, y in data:
        await one.ask(Step(x, y), timeout=120)
    return await one.ask(GetWeights(), timeout=120), await one.ask(Evaluate(*data[0]), timeout=120)


@pytest.mark.parametrize("stage", [1, 2, 3])
async def test_a_commit_answered_late_is_waited_for_and_the_step_completed(stage: int) -> None:
    plan = Plan()
    data = [synthetic_classification(6, 3, 2, seed=s) for s in range(2)]
    async with ActorSystem("zero-late-commit") as system:
        trainer = await _spawn(system, plan, stage)
        await trainer.ask(Step(*data[0]))
        plan.arm("commit", None, delay=1.4 * CONFIG.worker_timeout)
        await trainer.ask(Step(*data[1]))  # the step's stats, not AskTimeoutError
        assert plan.fired == ["commit"]
        weights, evaluation = await _reference(system, data)
        assert (await trainer.ask(GetTrainingState())).step == 2
        np.testing.assert_allclose(await trainer.ask(GetWeights()), weights, atol=1e-6)
        assert (await trainer.ask(Evaluate(*data[0]))).loss == pytest.approx(evaluation.loss)


async def test_a_commit_never_confirmed_is_answered_with_an_error_saying_it_was_applied() -> None:
    plan = Plan()
    data = synthetic_classification(6, 3, 2, seed=0)
    async with ActorSystem("zero-lost-commit") as system:
        trainer = await _spawn(system, plan)
        plan.arm("commit", None, delay=STALL)
        with pytest.raises(AskTimeoutError) as caught:
            await trainer.ask(Step(*data), timeout=STALL - 1.0)
        assert any("WAS applied" in note for note in caught.value.__notes__)


async def _unconfirmed_step(trainer: Any, plan: Plan, data: list[Any], refusals: int) -> None:
    """The first batch, then the second with replica SLOW refusing its
    CommitShard `refusals` times (the step is asked it twice)."""
    await trainer.ask(Step(*data[0]))
    plan.arm("commit", RuntimeError, times=refusals)
    with pytest.raises(RuntimeError, match="injected failure: commit") as caught:
        await trainer.ask(Step(*data[1]))
    assert any("WAS applied" in note for note in caught.value.__notes__)


@pytest.mark.parametrize("stage", [1, 2, 3])
async def test_a_step_never_confirmed_is_completed_before_the_next_request(stage: int) -> None:
    plan = Plan()
    data = [synthetic_classification(6, 3, 2, seed=s) for s in range(2)]
    async with ActorSystem("zero-completed-commit") as system:
        trainer = await _spawn(system, plan, stage)
        await _unconfirmed_step(trainer, plan, data, refusals=2)
        weights, evaluation = await _reference(system, data)
        # the working copies were all-gathered before Evaluate ran on them
        assert (await trainer.ask(Evaluate(*data[0]))).loss == pytest.approx(evaluation.loss)
        assert plan.fired == ["commit"] * 2
        assert (await trainer.ask(GetTrainingState())).step == 2
        np.testing.assert_allclose(await trainer.ask(GetWeights()), weights, atol=1e-6)


async def test_the_next_step_runs_on_the_completed_step() -> None:
    plan = Plan()
    data = [synthetic_classification(6, 3, 2, seed=s) for s in range(3)]
    async with ActorSystem("zero-step-after-commit") as system:
        trainer = await _spawn(system, plan)
        await _unconfirmed_step(trainer, plan, data, refusals=2)
        await trainer.ask(Step(*data[2]))
        weights, _ = await _reference(system, data)
        assert (await trainer.ask(GetTrainingState())).step == 3
        np.testing.assert_allclose(await trainer.ask(GetWeights()), weights, atol=1e-6)


async def test_a_step_that_still_cannot_be_completed_fails_the_next_request() -> None:
    plan = Plan()
    data = [synthetic_classification(6, 3, 2, seed=s) for s in range(2)]
    async with ActorSystem("zero-still-unconfirmed") as system:
        trainer = await _spawn(system, plan)
        await _unconfirmed_step(trainer, plan, data, refusals=4)  # the next request's two too
        with pytest.raises(RuntimeError, match="injected failure: commit") as caught:
            await trainer.ask(GetTrainingState())
        assert any("GetTrainingState was not served" in n for n in caught.value.__notes__)
        assert (await trainer.ask(GetTrainingState())).step == 2  # the one after completes it
        weights, _ = await _reference(system, data)
        np.testing.assert_allclose(await trainer.ask(GetWeights()), weights, atol=1e-6)


async def _stuck(trainer: Any, plan: Plan, data: list[Any], checkpoint: Path) -> None:
    """A step, a checkpoint of it, then a step whose commit replica SLOW keeps
    refusing: every request after it fails, the step never completed."""
    await trainer.ask(Step(*data[0]))
    await trainer.ask(SaveCheckpoint(checkpoint))
    plan.arm("commit", RuntimeError, times=1000)
    with pytest.raises(RuntimeError, match="injected failure: commit"):
        await trainer.ask(Step(*data[1]))
    with pytest.raises(RuntimeError, match="injected failure: commit"):
        await trainer.ask(GetWeights())


@pytest.mark.parametrize("stage", [1, 2, 3])
async def test_a_checkpoint_load_is_the_way_out_of_a_commit_never_confirmed(
    stage: int, tmp_path: Path
) -> None:
    plan = Plan()
    data = [synthetic_classification(6, 3, 2, seed=s) for s in range(3)]
    checkpoint = tmp_path / "c.ckpt"
    async with ActorSystem("zero-load-out") as system:
        trainer = await _spawn(system, plan, stage)
        await _stuck(trainer, plan, data, checkpoint)
        fired = len(plan.fired)
        await trainer.ask(LoadCheckpoint(checkpoint))  # was: refused, the commit asked again
        assert len(plan.fired) == fired  # the load did not wait for the commit
        plan.disarm("commit")
        assert (await trainer.ask(GetTrainingState())).step == 1
        await trainer.ask(Step(*data[2]))
        one = await Trainer.spawn(system, Mlp([3, 4, 2], seed=1), ["cpu:0"], UNHURRIED)
        await one.ask(LoadCheckpoint(checkpoint), timeout=120)  # the same start
        await one.ask(Step(*data[2]), timeout=120)
        assert (await trainer.ask(GetTrainingState())).step == 2
        np.testing.assert_allclose(
            await trainer.ask(GetWeights()), await one.ask(GetWeights()), atol=1e-6
        )
        evaluation = await one.ask(Evaluate(*data[0]))
        assert (await trainer.ask(Evaluate(*data[0]))).loss == pytest.approx(evaluation.loss)


async def test_after_a_failed_load_out_of_an_unconfirmed_commit_only_a_load_is_served(
    tmp_path: Path,
) -> None:
    plan = Plan()
    data = [synthetic_classification(6, 3, 2, seed=s) for s in range(2)]
    checkpoint = tmp_path / "c.ckpt"
    async with ActorSystem("zero-load-out-failed") as system:
        trainer = await _spawn(system, plan)
        await _stuck(trainer, plan, data, checkpoint)
        with pytest.raises(FileNotFoundError):
            await trainer.ask(LoadCheckpoint(tmp_path / "missing.ckpt"))
        plan.disarm("commit")  # a commit now would keep a step of no whole state
        with pytest.raises(RuntimeError, match="only LoadCheckpoint is served"):
            await trainer.ask(GetWeights())
        await trainer.ask(LoadCheckpoint(checkpoint))
        assert (await trainer.ask(GetTrainingState())).step == 1
