"""Hierarchical data parallel across processes: `DistributedDataParallel`.

In each process a `DataParallelTrainer` drives the local devices; its
`process_collective` (an `MpiCollective`) joins the processes. One step:

1. every process takes its shard of the global batch (`shard_for_rank`),
2. its replicas compute gradient *sums* and reduce them locally,
3. one MPI all-reduce sums gradient, loss sum, normaliser and sample count
   across the processes,
4. every replica of every process divides by the global normaliser and
   applies the same update,

so N processes x M replicas equal one device on the global batch. The
initial weights are broadcast from rank 0 when the trainers start (a rank may
build its model from any seed); only rank 0 writes checkpoints, every rank
can load them.

`await spawn_distributed_data_parallel(system, model, local_devices, config,
dist_config)` builds it all and returns the handle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from atomr.accel import Device
from atomr.actor import ActorRef
from atomr.train.comm.collective import Collective
from atomr.train.comm.mpi.job import DistributedTrainConfig
from atomr.train.core.checkpoint import CheckpointError
from atomr.train.core.config import TrainerConfig
from atomr.train.core.messages import (
    GetReplicaWeights,
    GetWeights,
    LoadCheckpoint,
    SaveCheckpoint,
    Step,
)
from atomr.train.core.mlp import Mlp
from atomr.train.core.stats import StepStats
from atomr.train.data_parallel.trainer import DataParallelConfig, DataParallelTrainer

__all__ = ["DistributedDataParallel", "spawn_distributed_data_parallel"]


@dataclass
class DistributedDataParallel:
    """One process's part of a multi-process data-parallel job.

    Every method that talks to the other processes must be called by every
    rank, in the same order (they are collective).

    Attributes:
        trainer: the local `DataParallelTrainer`'s `ActorRef` (answers the
            usual trainer messages; its `Step` takes this rank's shard).
        collective: the collective joining the processes (an `MpiCollective`
            in a real job), or None in a single process.
        config: this process's `DistributedTrainConfig`.
        ask_timeout: seconds to wait for the trainer's replies; keep it above
            the collective's timeout, so a missing rank is reported by the
            collective (naming the rank) rather than by the ask.
    """

    trainer: ActorRef
    collective: Collective | None
    config: DistributedTrainConfig
    ask_timeout: float = 600.0

    async def step(self, features: np.ndarray, labels: np.ndarray) -> StepStats:
        """Train one step on the *global* batch; this rank uses its shard.

        Every rank must pass the same global batch (e.g. drawn from the same
        seed). Each rank's shard must hold at least one sample per local
        replica.

        Args:
            features, labels: the global batch (as for `Step`).

        Returns:
            The step's `StepStats`: loss and gradient norm of the global
            batch (identical on every rank); `samples` is this rank's share.

        Raises:
            CollectiveTimeoutError, RankFailedError: a rank did not take part.
            InvalidBatchError, NonFiniteError: bad input (nothing applied).
        """
        part = self.config.shard(int(features.shape[0]))
        return await self.step_shard(features[part], labels[part])

    async def step_shard(self, features: np.ndarray, labels: np.ndarray) -> StepStats:
        """Train one step; `features`/`labels` are this rank's shard already.

        Raises:
            as `step`.
        """
        stats: StepStats = await self.trainer.ask(Step(features, labels), timeout=self.ask_timeout)
        return stats

    async def weights(self) -> np.ndarray:
        """The flat weight vector (replica 0's of this process)."""
        w: np.ndarray = await self.trainer.ask(GetWeights(), timeout=self.ask_timeout)
        return w

    async def replica_weights(self) -> list[np.ndarray]:
        """Every local replica's weight vector."""
        ws: list[np.ndarray] = await self.trainer.ask(GetReplicaWeights(), timeout=self.ask_timeout)
        return ws

    async def save_checkpoint(self, path: Any) -> bool:
        """Rank 0 writes the checkpoint (atomically); the others wait for it.

        Collective: on return the file is durable for every rank, or every
        rank raises.

        Args:
            path: the checkpoint file (rank 0's file system).

        Returns:
            True on the rank that wrote the file, False on the others.

        Raises:
            CheckpointError: rank 0 could not write it (raised on every rank).
            CollectiveTimeoutError, RankFailedError: a rank did not take part.
        """
        error: BaseException | None = None
        if self.config.is_root:
            try:
                await self.trainer.ask(SaveCheckpoint(path), timeout=self.ask_timeout)
            except Exception as exc:  # reported to every rank below
                error = exc
        if self.collective is not None:
            status = np.array([0.0 if error is None else 1.0])
            await self.collective.broadcast([status], 0)
            if error is None and status[0] != 0.0:
                raise CheckpointError(f"rank 0 failed to write the checkpoint {path}")
        if error is not None:
            raise error
        return self.config.is_root

    async def load_checkpoint(self, path: Any) -> None:
        """Every rank loads the checkpoint into its replicas (collective: the
        ranks first wait for each other, so nobody reads a file still being
        written by a late `save_checkpoint`).

        Args:
            path: the checkpoint file, readable by every rank.

        Raises:
            CheckpointError, OSError: unreadable or for another model.
            CollectiveTimeoutError, RankFailedError: a rank did not take part.
        """
        if self.collective is not None:
            await self.collective.barrier()
        await self.trainer.ask(LoadCheckpoint(path), timeout=self.ask_timeout)

    def stop(self) -> None:
        """Stop the local trainer (and its replicas)."""
        self.trainer.stop()


async def spawn_distributed_data_parallel(
    system: Any,
    model: Mlp,
    local_devices: Sequence[Device | str],
    config: TrainerConfig,
    dist_config: DistributedTrainConfig,
    *,
    collective: Collective | None = None,
    parallel: DataParallelConfig | None = None,
    name: str | None = None,
) -> DistributedDataParallel:
    """Spawn this process's data-parallel trainer and join it to the job.

    Collective: every rank calls it at the same point. Returns once the
    local replicas hold rank 0's initial weights.

    Args:
        system: the `ActorSystem`.
        model: the model; only rank 0's weights matter (broadcast to all).
        local_devices: this process's devices, one replica each.
        config: optimizer, loss, clipping, accumulation (same on every rank).
        dist_config: this process's place in the job.
        collective: the process collective; default: a new `MpiCollective`
            from `dist_config` when `dist_config.backend == "mpi"`, none
            for a single process.
        parallel: the local `DataParallelConfig` (default: its defaults, with
            a reply timeout of at least 1.5 x the collective timeout).
        name: the trainer's actor name.

    Returns:
        The `DistributedDataParallel` handle.

    Raises:
        ImportError: MPI backend without mpi4py (`pip install 'atomr[mpi]'`).
        ValueError: `dist_config` disagrees with MPI, or no devices.
        CollectiveTimeoutError, RankFailedError: a rank did not join.
    """
    if collective is None and dist_config.backend == "mpi":
        from atomr.train.comm.mpi.collective import MpiCollective

        collective = MpiCollective.from_config(dist_config)
    if parallel is None and dist_config.collective_timeout is not None:
        # the first ask (which carries the weight broadcast) must outlast the
        # collective's timeout, so a missing rank is reported by name
        parallel = DataParallelConfig(timeout=max(60.0, 1.5 * dist_config.collective_timeout))
    trainer = await DataParallelTrainer.spawn(
        system,
        model,
        local_devices,
        config,
        parallel=parallel,
        process_collective=collective,
        name=name,
    )
    timeout = 600.0
    if dist_config.collective_timeout is not None:
        timeout = max(timeout, 2.0 * dist_config.collective_timeout)
    return DistributedDataParallel(trainer, collective, dist_config, ask_timeout=timeout)
