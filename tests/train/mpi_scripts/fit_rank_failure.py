"""Run under `mpiexec -n 2`: `fit` of a `ShardedDataParallelTrainer` (whose
save takes every process) in a job (`agree_to_stop` over the processes'
collective, as `atomr train --distributed` does), where rank 1's training
data raises in the first epoch and rank 0's does not.

argv: OUT_DIR TIMEOUT (the collective's, seconds). Rank 1 prints the
`DataSourceError` it got, with its notes, then aborts the job (exit code
3; rank 0 waits at its next step until then). Before, rank 1 first saved its
checkpoint alone: a save that takes every process, whose collectives either
waited for rank 0 until TIMEOUT or met rank 0's step's instead (at stage 1
they did: the save "succeeded", its note naming a checkpoint no file held).
Such a meeting is now refused before it happens: the operation check
(`comm/mpi/_order.py`) makes both ranks raise `CollectiveMismatchError`.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from atomr import ActorSystem
from atomr.accel import cpu_devices
from atomr.cli.job import MpiJob
from atomr.train import (
    LossKind,
    Mlp,
    OptimizerKind,
    ShardedDataParallelTrainer,
    ShardedOptions,
    TrainerConfig,
)
from atomr.train.comm.mpi.collective import MpiCollective
from atomr.train.comm.mpi.job import DistributedTrainConfig
from atomr.train.core import synthetic_classification
from atomr.train.fit import DataSourceError, fit

SIZES = [6, 8, 3]
X, Y = synthetic_classification(40, SIZES[0], SIZES[-1], seed=1)  # batch 8: five a epoch


async def main(out: Path, timeout: float) -> None:
    dist = DistributedTrainConfig.from_environment(require=True, collective_timeout=timeout)
    options = ShardedOptions.for_job(dist, stage=1)

    def data(epoch: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for k in range(0, 40, 8):
            if dist.rank == 1 and k == 16:
                raise OSError("rank 1's share went away")
            yield X[k : k + 8], Y[k : k + 8]

    config = TrainerConfig(OptimizerKind.adam(0.01), LossKind.CROSS_ENTROPY)
    async with ActorSystem() as system:
        trainer = await ShardedDataParallelTrainer.spawn(
            system, Mlp(SIZES, seed=0), cpu_devices(1), config, options
        )
        processes = options.process_collective
        assert isinstance(processes, MpiCollective)
        job = MpiJob(processes, dist.is_root)
        try:
            await fit(
                trainer, data, epochs=2, batch_size=8, checkpoint=out / "fit.ckpt",
                agree_to_stop=job.agree_to_stop, timeout=4 * timeout,
            )  # fmt: skip
        except DataSourceError as exc:
            print(f"[rank {dist.rank}] {exc!r} {' '.join(exc.__notes__)}", flush=True)
            processes.abort(3, "the training data failed")


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), float(sys.argv[2])))
