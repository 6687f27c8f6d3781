"""Run under `mpiexec -n N`: hierarchical data parallel, N processes x 2 local devices,
each process a `DataParallelTrainer` spawned with `DataParallelOptions.for_job`.

argv: OUT_DIR STEPS [VICTIM]. With VICTIM, that rank leaves (`os._exit(3)`)
at step 5 and the others must fail with an error naming it. Rank r builds its model from seed 100 + r (only rank
0's weights may matter: they are broadcast), trains STEPS steps on global
batches drawn from a shared seed, and writes into OUT_DIR:
  rank{r}_initial.npy   replica weights right after spawn   (R, P)
  rank{r}_final.npy     every local replica's weights after STEPS steps (R, P)
  rank{r}_loaded.npy    weights after one more step then loading the checkpoint
  rank{r}.json          losses, grad norms, whether this rank's checkpoint path exists
Every rank asks its trainer to save: rank 0 to `ckpt.atomr`, rank r > 0 to
`ckpt-rank{r}.atomr`, a path only process 0 may write (no other file may appear).
Then a second trainer accumulates 2 batches per step: one micro-step, a save
inside the window (`window.atomr`), the window's last step
(rank{r}_window.npy: replica 0's weights), a load of the save and that last
step again (rank{r}_window_again.npy).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from atomr import ActorSystem
from atomr.accel import cpu_devices
from atomr.train import (
    DataParallelOptions,
    DataParallelTrainer,
    LoadCheckpoint,
    LossKind,
    Mlp,
    OptimizerKind,
    SaveCheckpoint,
    Step,
    TrainerConfig,
)
from atomr.train.comm.mpi.collective import CollectiveError
from atomr.train.comm.mpi.job import DistributedTrainConfig
from atomr.train.data_parallel import GetReplicaWeights

SIZES = [6, 16, 4]
BATCH = 24
LOCAL_DEVICES = 2


def config() -> TrainerConfig:
    return TrainerConfig(OptimizerKind.sgd(0.1, momentum=0.9), LossKind.CROSS_ENTROPY)


async def save_inside_a_window(system: ActorSystem, out: Path, dist: Any, model: Mlp) -> None:
    """The module docstring's second trainer."""
    config = TrainerConfig(OptimizerKind.adam(0.01), LossKind.CROSS_ENTROPY, accumulation_steps=2)
    options = DataParallelOptions.for_job(dist)
    trainer = await DataParallelTrainer.spawn(
        system, model, cpu_devices(LOCAL_DEVICES), config, options
    )
    first, last = batch(100), batch(101)
    assert not (await trainer.ask(Step(*first), timeout=120)).applied
    await trainer.ask(SaveCheckpoint(out / "window.atomr"), timeout=120)
    assert (await trainer.ask(Step(*last), timeout=120)).applied
    np.save(out / f"rank{dist.rank}_window.npy", (await trainer.ask(GetReplicaWeights()))[0])
    await trainer.ask(LoadCheckpoint(out / "window.atomr"), timeout=120)
    assert (await trainer.ask(Step(*last), timeout=120)).applied
    again = (await trainer.ask(GetReplicaWeights()))[0]
    np.save(out / f"rank{dist.rank}_window_again.npy", again)
    await trainer.stop()


def batch(step: int) -> tuple[np.ndarray, np.ndarray]:
    from atomr.train.core import synthetic_classification

    return synthetic_classification(BATCH, SIZES[0], SIZES[-1], seed=500 + step)


async def main(out: Path, steps: int, victim: int | None) -> None:
    timeout = 60.0 if victim is None else 3.0
    dist = DistributedTrainConfig.from_environment(require=True, collective_timeout=timeout)
    model = Mlp(SIZES, activation="tanh", seed=100 + dist.rank)
    options = DataParallelOptions.for_job(dist)
    ckpt = out / ("ckpt.atomr" if dist.is_root else f"ckpt-rank{dist.rank}.atomr")
    async with ActorSystem() as system:
        trainer = await DataParallelTrainer.spawn(
            system, model, cpu_devices(LOCAL_DEVICES), config(), options
        )

        async def ask(message: object) -> Any:
            return await trainer.ask(message, timeout=4 * timeout)

        try:
            np.save(out / f"rank{dist.rank}_initial.npy", np.stack(await ask(GetReplicaWeights())))
            losses, norms = [], []
            for step in range(steps):
                if step == 5 and dist.rank == victim:
                    print(f"[rank {dist.rank}] leaving at step {step}", flush=True)
                    os._exit(3)
                x, y = batch(step)  # the global batch: the trainer takes this rank's share
                stats = await ask(Step(x, y))
                assert stats.samples == BATCH
                losses.append(stats.loss)
                norms.append(stats.grad_norm)
            np.save(out / f"rank{dist.rank}_final.npy", np.stack(await ask(GetReplicaWeights())))
            await ask(SaveCheckpoint(ckpt))
            wrote = ckpt.exists()
            x, y = batch(steps)
            await ask(Step(x, y))  # moves the weights away from the checkpoint
            await ask(LoadCheckpoint(out / "ckpt.atomr"))
            np.save(out / f"rank{dist.rank}_loaded.npy", np.stack(await ask(GetReplicaWeights())))
            if victim is None:
                await save_inside_a_window(system, out, dist, model)
        except CollectiveError as exc:
            collective = options.process_collective
            assert collective is not None
            collective.abort(2, f"{type(exc).__name__}: {exc}")  # type: ignore[attr-defined]
    report = {"rank": dist.rank, "losses": losses, "grad_norms": norms, "wrote_checkpoint": wrote}
    (out / f"rank{dist.rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    victim = int(sys.argv[3]) if len(sys.argv) > 3 else None
    asyncio.run(main(Path(sys.argv[1]), int(sys.argv[2]), victim))
