"""`TrainerConfig.max_steps` under every strategy: `GetTrainingState` reports
it, `fit` stops there, and a `Step` past it is refused with nothing changed.
Roles of a job's processes, and the seed's `ShardStepResult` name."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from atomr import ActorSystem
from atomr.accel import cpu_devices
from atomr.train import (
    AsyncParameterServer,
    GetWeights,
    LossKind,
    Mlp,
    OptimizerKind,
    ParameterServerOptions,
    Step,
    StepStats,
    TrainerConfig,
    fit,
)
from atomr.train.comm.mpi.job import DistributedTrainConfig
from atomr.train.core import (
    GetTrainingState,
    StepLimitError,
    TrainingState,
    synthetic_classification,
)
from atomr.train.core.stats import ShardStepResult
from atomr.train.parameter_server import Consistency, TrainEpochs
from tests.train.test_contract import STRATEGIES

CONFIG = TrainerConfig(OptimizerKind.sgd(0.1), LossKind.CROSS_ENTROPY, max_steps=5)
X, Y = synthetic_classification(64, 6, 3, seed=1)


@pytest.mark.parametrize("strategy", list(STRATEGIES))
async def test_every_strategy_stops_at_max_steps(strategy: str, tmp_path: Path) -> None:
    trainer_class, options, n = STRATEGIES[strategy]
    async with ActorSystem("limit") as system:
        ref = await trainer_class.spawn(system, Mlp([6, 8, 3], seed=0), cpu_devices(n), CONFIG,
                                        options)  # fmt: skip
        assert await ref.ask(GetTrainingState()) == TrainingState(0, 5, True)
        result = await fit(ref, (X, Y), epochs=10, batch_size=16, checkpoint=tmp_path / "c")
        assert result.status == "reached max_steps"
        assert result.position.step == 5 and (result.position.epoch, result.position.batch) == (
            1,
            1,
        )
        state = await ref.ask(GetTrainingState())
        assert state.reached_max_steps and state.step == 5
        before = await ref.ask(GetWeights())
        with pytest.raises(StepLimitError, match="max_steps"):
            await ref.ask(Step(X[:16], Y[:16]))
        np.testing.assert_array_equal(await ref.ask(GetWeights()), before)


def test_max_steps_is_checked() -> None:
    for bad, error in ((0, ValueError), (-3, ValueError), (2.5, TypeError), (True, TypeError)):
        with pytest.raises(error, match="max_steps"):
            TrainerConfig(OptimizerKind.sgd(0.1), LossKind.CROSS_ENTROPY, max_steps=bad)  # type: ignore[arg-type]


def test_roles_follow_the_rank_and_a_contradiction_is_refused() -> None:
    assert DistributedTrainConfig().role == "coordinator"
    worker = DistributedTrainConfig(world_size=3, rank=2, local_world_size=3, local_rank=2)
    assert (worker.role, worker.is_coordinator) == ("worker", False)
    assert DistributedTrainConfig(world_size=2, rank=0, role="coordinator").is_coordinator
    with pytest.raises(ValueError, match="contradicts rank 1"):
        DistributedTrainConfig(world_size=2, rank=1, local_world_size=2, local_rank=1,
                               role="coordinator")  # fmt: skip
    with pytest.raises(ValueError, match="role must be one of"):
        DistributedTrainConfig(role="boss")


def test_the_seed_name_shard_step_result_is_step_stats() -> None:
    assert ShardStepResult is StepStats


async def test_setup_finds_devices_chooses_the_trainer_and_says_so() -> None:
    import io

    from atomr.train import Step, setup
    from atomr.train.core import GetTrainingState
    from atomr.train.data_parallel import GetWorldSize

    out = io.StringIO()
    async with ActorSystem("setup") as system:
        ref = await setup(system, Mlp([6, 8, 3], seed=0), OptimizerKind.sgd(0.1), out=out)
        assert await ref.ask(GetWorldSize()) == 2  # two logical CPU devices here
        stats = await ref.ask(Step(X[:16], Y[:16]))
        assert isinstance(stats, StepStats)
        assert (await ref.ask(GetTrainingState())).step == 1
        single = await setup(system, Mlp([6, 8, 3]), devices=["cpu:0"], out=None)
        assert isinstance(await single.ask(Step(X[:8], Y[:8])), StepStats)
    line = out.getvalue().strip()
    assert line == "atomr: 2 logical CPU devices (cpu:0, cpu:1): DataParallelTrainer, sgd lr 0.1"


async def test_fit_stops_where_a_trainer_counting_its_own_updates_refuses(tmp_path: Path) -> None:
    # an asynchronous parameter server with 2 workers applies 2 updates per Step: it
    # reaches max_steps=5 on fit's third Step, refuses the next, and fit stops there
    options = ParameterServerOptions(workers=2)
    async with ActorSystem("limit") as system:
        ref = await AsyncParameterServer.spawn(system, Mlp([6, 8, 3], seed=0), cpu_devices(2),
                                               CONFIG, options)  # fmt: skip
        result = await fit(ref, (X, Y), epochs=10, batch_size=16, checkpoint=tmp_path / "c")
        state = await ref.ask(GetTrainingState())
    assert result.status == "reached max_steps"
    assert state.step == 5  # its third Step went to one worker: the limit met exactly
    assert result.position.step == 5  # fit counts the server's updates, in 3 Steps
    assert (tmp_path / "c").is_file()


@pytest.mark.parametrize(
    "consistency", [Consistency.asynchronous(), Consistency.bounded(1)], ids=["async", "ssp"]
)
async def test_a_parameter_server_does_not_pass_its_step_limit(consistency: Consistency) -> None:
    """With 4 workers and 5 updates allowed, the second Step goes to one
    worker (the whole batch its part), not to four (8 updates)."""
    options = ParameterServerOptions(workers=4, consistency=consistency)
    async with ActorSystem("limit") as system:
        ref = await AsyncParameterServer.spawn(system, Mlp([6, 8, 3], seed=0), cpu_devices(2),
                                               CONFIG, options)  # fmt: skip
        samples = [(await ref.ask(Step(X[:16], Y[:16]))).samples for _ in range(2)]
        assert (await ref.ask(GetTrainingState())).step == 5
        with pytest.raises(StepLimitError, match="max_steps"):
            await ref.ask(Step(X[:16], Y[:16]))
    assert samples == [16, 16]


async def test_train_epochs_is_refused_under_a_step_limit() -> None:
    """The workers run at their own pace and would pass it (before: 12
    updates for a limit of 5); nothing is trained."""
    async with ActorSystem("limit") as system:
        ref = await AsyncParameterServer.spawn(system, Mlp([6, 8, 3], seed=0), cpu_devices(2),
                                               CONFIG, ParameterServerOptions(workers=2))  # fmt: skip
        with pytest.raises(ValueError, match="TrainEpochs does not stop at max_steps"):
            await ref.ask(TrainEpochs(X, Y, epochs=1, batch_size=16))
        assert (await ref.ask(GetTrainingState())).step == 0
