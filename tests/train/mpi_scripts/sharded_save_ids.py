"""Run under `mpiexec -n 2`: the save id of a ZeRO save of one file per
replica (`ShardedOptions.shard_checkpoints`), written by two processes.

argv: OUT_DIR. 2 processes x 1 replica (stage 1): a trainer from seed 1
trains one step and saves to OUT_DIR/a/s.ckpt, then one from seed 2 the
same step to OUT_DIR/b/s.ckpt (the same step and generation: only the save
ids tell the two saves' shard files apart). Rank 1 writes shard 1 of each.
A third trainer (seed 3) loads a/s.ckpt, then OUT_DIR/mixed{r}/s.ckpt:
a's index and shard 0 beside b's shard 1, each rank its own copy. Each rank
writes rank{r}.json (the second load's error type and message) and
rank{r}_a.npy, rank{r}_loaded.npy, rank{r}_after.npy (the first trainer's
weights, the third's after the first load and after the second).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
from sharded_step_fault import CONFIG, SIZES, batch  # beside this script

from atomr import ActorSystem
from atomr.accel import cpu_devices
from atomr.train import (
    GetWeights,
    LoadCheckpoint,
    Mlp,
    SaveCheckpoint,
    ShardedDataParallelTrainer,
    ShardedOptions,
    Step,
)
from atomr.train.comm.mpi.job import DistributedTrainConfig
from atomr.train.sharded.checkpoints import shard_path

SHARDS = 2


async def _trainer(system: ActorSystem, dist: DistributedTrainConfig, seed: int) -> Any:
    options = ShardedOptions.for_job(dist, stage=1, shard_checkpoints=True)
    model = Mlp(SIZES, seed=seed)
    return await ShardedDataParallelTrainer.spawn(system, model, cpu_devices(1), CONFIG, options)


async def _saved(system: ActorSystem, dist: DistributedTrainConfig, seed: int, path: Path) -> Any:
    """One step of a new trainer from `seed`, saved at `path`; its weights."""
    trainer = await _trainer(system, dist, seed)
    await trainer.ask(Step(*batch(0)), timeout=60)
    await trainer.ask(SaveCheckpoint(path), timeout=60)
    weights = await trainer.ask(GetWeights(), timeout=60)
    await trainer.stop()
    return weights


def _mixed(out: Path, rank: int) -> Path:
    """This rank's copy of save a with save b's shard 1 in its shard 1's place."""
    folder = out / f"mixed{rank}"
    folder.mkdir()
    a, b, mixed = out / "a" / "s.ckpt", out / "b" / "s.ckpt", folder / "s.ckpt"
    shutil.copyfile(a, mixed)
    for g, source in enumerate((a, b)):
        shutil.copyfile(shard_path(source, g, SHARDS, 1), shard_path(mixed, g, SHARDS, 1))
    return mixed


async def main(out: Path) -> None:
    dist = DistributedTrainConfig.from_environment(require=True, collective_timeout=30.0)
    rank = dist.rank
    async with ActorSystem() as system:
        for seed, name in ((1, "a"), (2, "b")):
            (out / name).mkdir(exist_ok=True)
            weights = await _saved(system, dist, seed, out / name / "s.ckpt")
            if name == "a":
                np.save(out / f"rank{rank}_a.npy", weights)
        trainer = await _trainer(system, dist, 3)
        await trainer.ask(LoadCheckpoint(out / "a" / "s.ckpt"), timeout=60)
        np.save(out / f"rank{rank}_loaded.npy", await trainer.ask(GetWeights(), timeout=60))
        try:
            await trainer.ask(LoadCheckpoint(_mixed(out, rank)), timeout=60)
            report = {"type": "none", "message": ""}
        except Exception as exc:
            report = {"type": type(exc).__name__, "message": str(exc)}
        np.save(out / f"rank{rank}_after.npy", await trainer.ask(GetWeights(), timeout=60))
        (out / f"rank{rank}.json").write_text(json.dumps(report))
        await trainer.stop()


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
