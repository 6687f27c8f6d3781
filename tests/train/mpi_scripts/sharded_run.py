"""Run under `mpiexec -n N`: sharded data parallel (ZeRO stages 1, 2, 3 in
turn), N processes x 2 local devices, each process a
`ShardedDataParallelTrainer` spawned with `ShardedOptions.for_job`.

argv: OUT_DIR STEPS. Rank r builds its model from seed 100 + r (process 0's
weights must win), trains STEPS steps per stage on global batches drawn from
a shared seed (SGD with momentum, then AdamW; clipping on), and writes into
OUT_DIR, per stage K: rank{r}_stage{K}.npy (the full weights it assembles),
rank{r}_stage{K}.json (losses, grad norms), and stage{K}.ckpt: written by
rank 0 at stages 1 and 2; at stage 3 one file per replica from every
process (`shard_checkpoints`), saved twice (the second save replaces the
first's files), then a third time with rank 1's shard write failing: every
rank must fail (none waits for the others forever), and the second save
must stay whole; each rank writes the name of the error it got into
rank{r}_failed_save.txt.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from atomr import ActorSystem
from atomr.accel import cpu_devices
from atomr.train import (
    GetWeights,
    LossKind,
    Mlp,
    OptimizerKind,
    SaveCheckpoint,
    ShardedDataParallelTrainer,
    ShardedOptions,
    Step,
    TrainerConfig,
)
from atomr.train.comm.mpi.job import DistributedTrainConfig
from atomr.train.core import synthetic_classification
from atomr.train.sharded import _checkpointing as checkpointing

SIZES = [6, 11, 4]  # 77 + 11 + 44 + 4 = 136 parameters: 4 replicas split each layer unevenly
BATCH = 26
LOCAL_DEVICES = 2
STAGES = (1, 2, 3)


def config(stage: int) -> TrainerConfig:
    optimizer = OptimizerKind.sgd(0.1, momentum=0.9) if stage != 2 else OptimizerKind.adamw(0.02)
    return TrainerConfig(optimizer, LossKind.CROSS_ENTROPY, gradient_clip=0.5)


def batch(step: int) -> tuple[np.ndarray, np.ndarray]:
    return synthetic_classification(BATCH, SIZES[0], SIZES[-1], seed=700 + step)


async def save_with_rank_1_failing(trainer: Any, out: Path, rank: int) -> None:
    """The module docstring's third save (rank 1's disk refuses its shards)."""

    def refuse(*args: Any) -> None:
        raise OSError(28, "No space left on device (injected)")

    write = checkpointing.write_shards
    if rank == 1:
        checkpointing.write_shards = refuse  # type: ignore[assignment]
    try:
        await trainer.ask(SaveCheckpoint(out / "stage3.ckpt"), timeout=120)
        failed = "none"
    except Exception as exc:
        failed = type(exc).__name__
    finally:
        checkpointing.write_shards = write
    (out / f"rank{rank}_failed_save.txt").write_text(failed)


async def main(out: Path, steps: int) -> None:
    dist = DistributedTrainConfig.from_environment(require=True, collective_timeout=60.0)
    async with ActorSystem() as system:
        for stage in STAGES:
            model = Mlp(SIZES, activation="tanh", seed=100 + dist.rank)
            options = ShardedOptions.for_job(dist, stage=stage, shard_checkpoints=stage == 3)
            trainer = await ShardedDataParallelTrainer.spawn(
                system, model, cpu_devices(LOCAL_DEVICES), config(stage), options
            )
            losses, norms = [], []
            for step in range(steps):
                stats = await trainer.ask(Step(*batch(step)), timeout=120)
                losses.append(stats.loss)
                norms.append(stats.grad_norm)
            weights = await trainer.ask(GetWeights(), timeout=120)
            np.save(out / f"rank{dist.rank}_stage{stage}.npy", weights)
            for _ in range(2 if stage == 3 else 1):
                await trainer.ask(SaveCheckpoint(out / f"stage{stage}.ckpt"), timeout=120)
            if stage == 3:
                await save_with_rank_1_failing(trainer, out, dist.rank)
            report = {"losses": losses, "grad_norms": norms}
            (out / f"rank{dist.rank}_stage{stage}.json").write_text(json.dumps(report))
            await trainer.stop()


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), int(sys.argv[2])))
