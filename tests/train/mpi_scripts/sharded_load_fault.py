"""Run under `mpiexec -n 2`: a ZeRO `LoadCheckpoint` that fails on one process only.

argv: OUT_DIR. For each stage K of 1, 2, 3: 2 processes x 1 replica train
two steps, save, train a third, then load the save; on rank 1 the load
fails: at stages 1 and 3 its file is missing (a node without the shared
disk), at stage 2 its replica refuses its part (`SetShardState`). Then a
fourth step. Each rank writes rank{r}_stage{K}.json (the load's error type
and message, the trainer's step count) and rank{r}_stage{K}.npy (its
GetWeights at the end).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from sharded_step_fault import CONFIG, SIZES, batch, finish, main  # beside this script

from atomr import ActorSystem
from atomr.accel import cpu_devices
from atomr.testkit import Plan, inject_faults
from atomr.train import (
    LoadCheckpoint,
    Mlp,
    SaveCheckpoint,
    ShardedDataParallelTrainer,
    ShardedOptions,
    Step,
)
from atomr.train.comm.mpi.job import DistributedTrainConfig
from atomr.train.core import GetTrainingState
from atomr.train.sharded import ShardedReplica
from atomr.train.sharded.messages import SetShardState


async def run_stage(
    system: ActorSystem, dist: DistributedTrainConfig, stage: int, out: Path
) -> None:
    plan = Plan()
    replica = inject_faults(ShardedReplica, plan, {"set": SetShardState})
    failing = dist.rank == 1
    options = ShardedOptions.for_job(
        dist, stage=stage, replica_class=replica if failing else ShardedReplica
    )
    trainer = await ShardedDataParallelTrainer.spawn(
        system, Mlp(SIZES, seed=1), cpu_devices(1), CONFIG, options
    )
    for step in range(2):
        await trainer.ask(Step(*batch(step)), timeout=60)
    await trainer.ask(SaveCheckpoint(out / f"stage{stage}.ckpt"), timeout=60)
    await trainer.ask(Step(*batch(2)), timeout=60)
    path = out / (f"stage{stage}.ckpt" if not (failing and stage != 2) else "missing.ckpt")
    plan.arm("set", RuntimeError)
    try:
        await trainer.ask(LoadCheckpoint(path), timeout=60)
        report = {"type": "none", "message": ""}
    except Exception as exc:
        report = {"type": type(exc).__name__, "message": str(exc)}
    await trainer.ask(Step(*batch(3)), timeout=60)
    report["steps"] = (await trainer.ask(GetTrainingState(), timeout=60)).step
    await finish(trainer, dist, stage, out, report)


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), run_stage))
