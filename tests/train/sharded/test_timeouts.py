"""`TrainerConfig.worker_timeout` is every replica reply's deadline in
`ShardedDataParallelTrainer`: a replica stalling past it fails the request
with the replica's own timeout, whatever the message."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from atomr import ActorSystem, AskTimeoutError
from atomr.accel import cpu_devices
from atomr.testkit import Plan, inject_faults
from atomr.train import (
    GetWeights,
    LoadCheckpoint,
    LossKind,
    Mlp,
    OptimizerKind,
    SaveCheckpoint,
    ShardedDataParallelTrainer,
    ShardedOptions,
    TrainerConfig,
)
from atomr.train.sharded import GetShardMemory, ShardedReplica
from atomr.train.sharded.messages import GetShardState

SLOW = 1
STALL = 3.0  # far beyond worker_timeout, below the asker's own timeout
CONFIG = TrainerConfig(OptimizerKind.sgd(0.1), LossKind.CROSS_ENTROPY, worker_timeout=0.3)


async def _spawn(system: ActorSystem, plan: Plan, stage: int = 1) -> Any:
    phases: dict[str, str | type] = {"state": GetShardState, "memory": GetShardMemory}
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
