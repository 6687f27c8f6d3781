"""`ShardedOptions`: the settings of `ShardedDataParallelTrainer`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from atomr._arguments import bool_flag, int_at_least
from atomr._repr import bounded_repr
from atomr.train.comm.collective import Collective
from atomr.train.comm.mpi.job import MAX_PROCESSES, DistributedTrainConfig
from atomr.train.data_parallel.options import DataParallelOptions
from atomr.train.sharded.replica import ShardedReplica

__all__ = ["ShardedOptions"]


@dataclass(frozen=True)
class ShardedOptions:
    """How a `ShardedDataParallelTrainer` shards and joins its replicas.

    Attributes:
        stage: the ZeRO stage: 1 (optimizer state sharded), 2 (and the
            reduced gradients), 3 (and the parameters, gathered layer by
            layer).
        collective: joins the local replicas: "host" (a `HostCollective`
            the trainer makes and closes) or a `Collective` taking host
            arrays, which the caller owns.
        process_collective: joins the processes of a multi-process job
            (`for_job`), or None for one process.
        process_rank: this process's rank, in `[0, process_count)`.
        process_count: the processes of the job (at most `MAX_PROCESSES`).
        shard_checkpoints: `SaveCheckpoint` writes one file per replica (and
            a small index at the path) instead of the full checkpoint
            (`atomr.train.sharded.checkpoints`); `LoadCheckpoint` reads either.
        replica_class: the replica actor `spawn` builds: `ShardedReplica` or a
            subclass (an instrumented or fault-injected one,
            `atomr.testkit.inject_faults`).

    Raises:
        TypeError: a field of the wrong type (a stage, rank or count that is
            no int: 2.0, True; NumPy's integers are ints, `_arguments`).
        ValueError: a stage other than 1, 2, 3; a collective name other than
            "host"; a collective that keeps its buffers on its members; a
            rank out of range; several processes without a process
            collective.
    """

    stage: int = 1
    collective: str | Collective = "host"
    process_collective: Collective | None = None
    process_rank: int = 0
    process_count: int = 1
    shard_checkpoints: bool = False
    replica_class: type[ShardedReplica] = ShardedReplica

    def __post_init__(self) -> None:
        stage = int_at_least("stage", self.stage, 1)  # 2.0 would pass `in (1, 2, 3)`
        if stage not in (1, 2, 3):
            raise ValueError(f"stage must be 1, 2 or 3, got {stage!r}")
        object.__setattr__(self, "stage", stage)
        c = self.collective
        if isinstance(c, str) and c != "host":  # a name, but not one it knows
            raise ValueError(f"collective must be 'host' or a Collective, got {bounded_repr(c)}")
        if not isinstance(c, str | Collective):
            raise TypeError(f"collective must be 'host' or a Collective, got {type(c).__name__}")
        for name in ("collective", "process_collective"):
            value = getattr(self, name)
            if isinstance(value, Collective) and value.members_hold_buffers:
                raise ValueError(
                    f"{name} {type(value).__name__} keeps its buffers on its members; the "
                    "sharded trainer exchanges host arrays (use HostCollective or MpiCollective)"
                )
        pc = self.process_collective
        if pc is not None and not isinstance(pc, Collective):
            raise TypeError(f"process_collective must be a Collective, got {type(pc).__name__}")
        self._check_processes()
        sharded = bool_flag("shard_checkpoints", self.shard_checkpoints)
        object.__setattr__(self, "shard_checkpoints", sharded)
        rc = self.replica_class
        if not (isinstance(rc, type) and issubclass(rc, ShardedReplica)):
            raise TypeError(f"replica_class must be ShardedReplica or a subclass, got {rc!r}")

    def _check_processes(self) -> None:
        count = int_at_least("process_count", self.process_count, 1, high=MAX_PROCESSES)
        rank = int_at_least("process_rank", self.process_rank, 0)
        object.__setattr__(self, "process_count", count)
        object.__setattr__(self, "process_rank", rank)
        if rank >= count:
            raise ValueError(
                f"need 0 <= process_rank < process_count, got {self.process_rank}, "
                f"{self.process_count}"
            )
        if self.process_count > 1 and self.process_collective is None:
            raise ValueError("a multi-process job needs a process_collective (see for_job)")

    @classmethod
    def for_job(
        cls,
        job: DistributedTrainConfig,
        *,
        process_collective: Collective | None = None,
        **settings: Any,
    ) -> ShardedOptions:
        """This process's options in a multi-process job (as
        `DataParallelOptions.for_job`: every rank calls it at the same point).

        Raises:
            TypeError, ValueError, ImportError: as `DataParallelOptions.for_job`.
        """
        joined = DataParallelOptions.for_job(job, process_collective=process_collective)
        return cls(
            process_collective=joined.process_collective,
            process_rank=joined.process_rank,
            process_count=joined.process_count,
            **settings,
        )
