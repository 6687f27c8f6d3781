"""Run under `mpiexec -n N`: hierarchical data parallel, N processes x 2 local devices.

argv: OUT_DIR STEPS [VICTIM]. With VICTIM, that rank leaves (`os._exit(3)`)
at step 5 and the others must fail with an error naming it. Rank r builds its model from seed 100 + r (only rank
0's weights may matter: they are broadcast), trains STEPS steps on global
batches drawn from a shared seed, and writes into OUT_DIR:
  rank{r}_initial.npy   replica weights right after spawn   (R, P)
  rank{r}_final.npy     every local replica's weights after STEPS steps (R, P)
  rank{r}_loaded.npy    weights after one more step then loading the checkpoint
  rank{r}.json          losses, grad norms, whether this rank wrote the checkpoint
The checkpoint `ckpt.atomr` is written into OUT_DIR by rank 0 only.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import numpy as np

from atomr import ActorSystem
from atomr.accel import cpu_devices
from atomr.train import LossKind, Mlp, OptimizerKind, TrainerConfig
from atomr.train.comm.mpi.collective import CollectiveError
from atomr.train.comm.mpi.job import DistributedTrainConfig
from atomr.train.data_parallel.distributed import spawn_distributed_data_parallel

SIZES = [6, 16, 4]
BATCH = 24
LOCAL_DEVICES = 2


def config() -> TrainerConfig:
    return TrainerConfig(OptimizerKind.sgd(0.1, momentum=0.9), LossKind.CROSS_ENTROPY)


def batch(step: int) -> tuple[np.ndarray, np.ndarray]:
    from atomr.train import synthetic_classification

    return synthetic_classification(BATCH, SIZES[0], SIZES[-1], seed=500 + step)


async def main(out: Path, steps: int, victim: int | None) -> None:
    timeout = 60.0 if victim is None else 3.0
    dist = DistributedTrainConfig.from_environment(require=True, collective_timeout=timeout)
    model = Mlp(SIZES, activation="tanh", seed=100 + dist.rank)
    async with ActorSystem() as system:
        ddp = await spawn_distributed_data_parallel(
            system, model, cpu_devices(LOCAL_DEVICES), config(), dist
        )
        try:
            np.save(out / f"rank{dist.rank}_initial.npy", np.stack(await ddp.replica_weights()))
            losses, norms = [], []
            for step in range(steps):
                if step == 5 and dist.rank == victim:
                    print(f"[rank {dist.rank}] leaving at step {step}", flush=True)
                    os._exit(3)
                x, y = batch(step)
                stats = await ddp.step(x, y)
                losses.append(stats.loss)
                norms.append(stats.grad_norm)
            np.save(out / f"rank{dist.rank}_final.npy", np.stack(await ddp.replica_weights()))
            wrote = await ddp.save_checkpoint(out / "ckpt.atomr")
            x, y = batch(steps)
            await ddp.step(x, y)  # moves the weights away from the checkpoint
            await ddp.load_checkpoint(out / "ckpt.atomr")
            np.save(out / f"rank{dist.rank}_loaded.npy", np.stack(await ddp.replica_weights()))
        except CollectiveError as exc:
            assert ddp.collective is not None
            ddp.collective.abort(2, f"{type(exc).__name__}: {exc}")  # type: ignore[attr-defined]
    report = {"rank": dist.rank, "losses": losses, "grad_norms": norms, "wrote_checkpoint": wrote}
    (out / f"rank{dist.rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    victim = int(sys.argv[3]) if len(sys.argv) > 3 else None
    asyncio.run(main(Path(sys.argv[1]), int(sys.argv[2]), victim))
