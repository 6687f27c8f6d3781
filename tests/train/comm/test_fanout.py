"""`SetLearningRate` is all or none for every trainer that fans it out to its
workers (`atomr.train.comm._fanout.set_learning_rate`): when one worker
fails to take the new rate, every worker keeps (gets back) the old one, and
the asker gets the failing worker's own error naming it.

The fault goes in through the public seam (`atomr.testkit.inject_faults` on
the `SetLearningRate` message, the trainers' worker-class options): the
worker fails before taking the rate, or after (`after=True`). The rate
each worker then uses is read off the weights of the following `Step`s,
compared to a single-device `Trainer` given the rates that took effect.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest

from atomr import ActorRef, ActorSystem
from atomr.accel import cpu_devices
from atomr.testkit import Plan, inject_faults
from atomr.train import (
    DataParallelTrainer,
    GetWeights,
    LossKind,
    Mlp,
    OptimizerKind,
    PipelineParallelTrainer,
    SetLearningRate,
    ShardedDataParallelTrainer,
    Step,
    TensorParallelTrainer,
    Trainer,
    TrainerConfig,
)
from atomr.train.data_parallel import DataParallelOptions, ReplicaActor
from atomr.train.pipeline import PipelineOptions, StageActor
from atomr.train.sharded import ShardedOptions, ShardedReplica
from atomr.train.tensor_parallel import ShardActor, TensorParallelOptions
from tests.reliability.faults import CLASSES, IN, T, batches

SIZES = [IN, 8, 8, CLASSES]
CONFIG = TrainerConfig(OptimizerKind.sgd(0.1), LossKind.CROSS_ENTROPY)
FAULTY = 1
PHASES: dict[str, str | type] = {"lr": SetLearningRate}


def _model() -> Mlp:
    return Mlp(SIZES, seed=4)


async def _pipeline(system: ActorSystem, plan: Plan) -> ActorRef:
    stage = inject_faults(StageActor, plan, PHASES, worker=FAULTY)
    options = PipelineOptions(6, stage_class=stage)
    return await PipelineParallelTrainer.spawn(system, _model(), cpu_devices(3), CONFIG, options)


async def _tensor(system: ActorSystem, plan: Plan) -> ActorRef:
    shard = inject_faults(ShardActor, plan, PHASES, worker=FAULTY)
    options = TensorParallelOptions(shard_class=shard)
    return await TensorParallelTrainer.spawn(system, _model(), cpu_devices(2), CONFIG, options)


async def _data(system: ActorSystem, plan: Plan) -> ActorRef:
    replica = inject_faults(ReplicaActor, plan, PHASES, worker=FAULTY)
    options = DataParallelOptions(replica_class=replica)
    return await DataParallelTrainer.spawn(system, _model(), cpu_devices(3), CONFIG, options)


async def _sharded(system: ActorSystem, plan: Plan) -> ActorRef:
    replica = inject_faults(ShardedReplica, plan, PHASES, worker=FAULTY)
    options = ShardedOptions(stage=2, replica_class=replica)
    return await ShardedDataParallelTrainer.spawn(system, _model(), cpu_devices(3), CONFIG, options)


SPAWN: dict[str, Callable[[ActorSystem, Plan], Awaitable[ActorRef]]] = {
    "pipeline": _pipeline,
    "tensor_parallel": _tensor,
    "data_parallel": _data,
    "sharded": _sharded,
}


async def _step(trainers: list[ActorRef], x: Any, y: Any) -> None:
    for trainer in trainers:
        await trainer.ask(Step(x, y), timeout=T)


async def _assert_same_weights(parallel: ActorRef, single: ActorRef) -> None:
    np.testing.assert_allclose(
        await parallel.ask(GetWeights(), timeout=T),
        await single.ask(GetWeights(), timeout=T),
        atol=1e-5,
    )


@pytest.mark.parametrize("after", [False, True], ids=["refused", "failed_after_taking_it"])
@pytest.mark.parametrize("kind", list(SPAWN))
async def test_a_worker_failing_to_take_the_rate_leaves_every_worker_at_the_old_one(
    actor_system: ActorSystem, kind: str, after: bool
) -> None:
    plan = Plan()
    parallel = await SPAWN[kind](actor_system, plan)
    single = await Trainer.spawn(actor_system, _model(), "cpu:0", CONFIG)
    data = batches(3)
    await _step([parallel, single], *data[0])
    plan.arm("lr", RuntimeError, after=after)
    with pytest.raises(RuntimeError, match="injected") as failed:
        await parallel.ask(SetLearningRate(0.5), timeout=T)
    assert plan.fired == ["lr"]
    assert getattr(failed.value, "worker_index", None) == FAULTY
    notes = " ".join(getattr(failed.value, "__notes__", []))
    assert "every worker was given back the learning rate 0.1" in notes, notes
    await _step([parallel, single], *data[1])  # every worker still at 0.1
    await _assert_same_weights(parallel, single)
    await parallel.ask(SetLearningRate(0.5), timeout=T)  # the fault fired once: now it takes
    await single.ask(SetLearningRate(0.5), timeout=T)
    await _step([parallel, single], *data[2])
    await _assert_same_weights(parallel, single)


async def test_a_worker_refusing_the_old_rate_back_too_is_named_in_the_note(
    actor_system: ActorSystem,
) -> None:
    plan = Plan()
    pipe = await _pipeline(actor_system, plan)
    plan.arm("lr", RuntimeError, times=2, after=True)  # takes 0.5, then refuses 0.1 back
    with pytest.raises(RuntimeError, match="injected") as failed:
        await pipe.ask(SetLearningRate(0.5), timeout=T)
    assert plan.fired == ["lr", "lr"]
    assert getattr(failed.value, "worker_index", None) == FAULTY
    notes = " ".join(getattr(failed.value, "__notes__", []))
    assert f"workers [{FAULTY}] may hold another learning rate" in notes, notes
    assert "send SetLearningRate again" in notes
    await pipe.ask(SetLearningRate(0.5), timeout=T)  # what the note says to do works
