"""`DistributedTrainConfig`: where this process sits in a multi-process job.

A job launched by `mpiexec -n N` (or `atomr launch -n N`) runs N copies of
the same program. Each copy is one *rank*; it drives the local devices of its
machine with a `DataParallelTrainer` and joins the other ranks through an
`MpiCollective`. This module holds what a rank needs to know about itself
and the two pure helpers the `atomr train --distributed` command builds on:

- `DistributedTrainConfig.from_environment()` reads rank, world size and the
  node-local rank from the variables the MPI launcher sets (MPICH/hydra,
  Open MPI, PMIx, Slurm), without importing mpi4py.
- `shard_for_rank(n_samples, rank, world_size)` gives each rank its
  contiguous share of a global batch (`split_bounds`: the first
  `n % world_size` ranks get one sample more), so the ranks' shards, concatenated in rank order, are the
  global batch.

mpi4py is optional: nothing here imports it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from atomr._arguments import real_number
from atomr._repr import bounded_repr
from atomr.train.core.partition import split_bounds

__all__ = ["MAX_PROCESSES", "DistributedTrainConfig", "NotLaunchedError", "shard_for_rank"]

MAX_PROCESSES = 2**31 - 1
"""The most processes a job can have (its `world_size`, `mpiexec -n`, a
trainer's `process_count`): MPI numbers its ranks with C ints, and hydra's
`mpiexec -n` took a larger count modulo 2**32 (`-n 4294967298` ran 2
processes)."""

# (rank, size, local rank, local size) variables, per launcher, most specific first.
_LAUNCHERS: tuple[tuple[str, str, str, str, str], ...] = (
    # name, rank, size, local rank, local size
    ("mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    (
        "openmpi",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
    ),
    ("pmix", "PMIX_RANK", "PMIX_SIZE", "PMIX_LOCAL_RANK", "PMIX_LOCAL_SIZE"),
    ("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"),
)

BACKENDS = ("mpi", "none")
ROLES = ("coordinator", "worker")


class NotLaunchedError(RuntimeError):
    """`DistributedTrainConfig.from_environment(require=True)` found no MPI
    launcher variables: the program was not started by `mpiexec` /
    `atomr launch`."""


@dataclass(frozen=True, slots=True)
class DistributedTrainConfig:
    """This process's place in a multi-process training job.

    Attributes:
        world_size: number of processes (ranks) in the job, >= 1 and at
            most `MAX_PROCESSES`.
        rank: this process's rank, in `[0, world_size)`. Rank 0 broadcasts
            the initial weights and is the only one that writes checkpoints.
        local_rank: this process's rank among the processes of its machine,
            in `[0, local_world_size)`; use it to pick local devices (e.g. the
            GPUs `cuda:{local_rank * k} ...`).
        local_world_size: number of processes on this machine, >= 1.
        backend: "mpi" (an `MpiCollective` joins the ranks) or "none" (a
            single process; no collective is needed).
        collective_timeout: seconds a collective may wait for the other ranks
            before failing with an error that names the missing rank(s)
            (`CollectiveTimeoutError`), or None to wait forever.
        role: "coordinator" (rank 0) or "worker" (every other rank), as in
            entrenar's config; derived from the rank, and checked when given.
            There is no coordinator address to set: the MPI launcher does the
            rendezvous (hydra's PMI server, or the scheduler's), so the
            coordinator is simply rank 0 of `MPI_COMM_WORLD`. The step limit
            of entrenar's config is `TrainerConfig.max_steps`, for every
            strategy.

    Raises:
        TypeError: `collective_timeout` is not a number or None (a bool is
            not one; NumPy's numbers are: `atomr._arguments`).
        ValueError: a field is out of range or inconsistent.
    """

    world_size: int = 1
    rank: int = 0
    local_rank: int = 0
    local_world_size: int = 1
    backend: str = "none"
    collective_timeout: float | None = 120.0
    role: str | None = None

    def __post_init__(self) -> None:
        for name in ("world_size", "rank", "local_rank", "local_world_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an int, got {bounded_repr(value)}")
        if self.world_size < 1 or self.local_world_size < 1:
            raise ValueError(
                f"world_size and local_world_size must be >= 1, got "
                f"{bounded_repr(self.world_size)} and {bounded_repr(self.local_world_size)}"
            )
        if self.world_size > MAX_PROCESSES:
            raise ValueError(
                f"world_size must be <= {MAX_PROCESSES}, got {bounded_repr(self.world_size)}"
            )
        if not 0 <= self.rank < self.world_size:
            raise ValueError(
                f"rank must be in [0, {self.world_size}), got {bounded_repr(self.rank)}"
            )
        if not 0 <= self.local_rank < self.local_world_size:
            raise ValueError(
                f"local_rank must be in [0, {bounded_repr(self.local_world_size)}), "
                f"got {bounded_repr(self.local_rank)}"
            )
        if self.local_world_size > self.world_size:
            raise ValueError(
                f"local_world_size {bounded_repr(self.local_world_size)} exceeds "
                f"world_size {self.world_size}"
            )
        self._check_role()
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        timeout = self.collective_timeout
        if timeout is not None and not 0.0 < real_number("collective_timeout", timeout) < math.inf:
            raise ValueError(
                f"collective_timeout must be positive and finite or None, "
                f"got {self.collective_timeout}"
            )

    def _check_role(self) -> None:
        derived = "coordinator" if self.rank == 0 else "worker"
        if self.role is not None and self.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES} or None, got {self.role!r}")
        if self.role is not None and self.role != derived:
            raise ValueError(
                f"role {self.role!r} contradicts rank {self.rank}: rank 0 is the coordinator, "
                "every other rank a worker"
            )
        object.__setattr__(self, "role", derived)

    @property
    def is_coordinator(self) -> bool:
        """True for the coordinator (rank 0; the same as `is_root`)."""
        return self.role == "coordinator"

    @property
    def is_distributed(self) -> bool:
        """True when the job has more than one rank."""
        return self.world_size > 1

    @property
    def is_root(self) -> bool:
        """True on rank 0 (the rank that broadcasts weights and writes checkpoints)."""
        return self.rank == 0

    def shard(self, n_samples: int) -> slice:
        """This rank's share of a global batch of `n_samples` (see `shard_for_rank`)."""
        return shard_for_rank(n_samples, self.rank, self.world_size)

    @classmethod
    def from_environment(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        require: bool = False,
        collective_timeout: float | None = 120.0,
    ) -> DistributedTrainConfig:
        """Read this process's rank and world size from the MPI launcher.

        Understands MPICH/hydra (`PMI_RANK`, `PMI_SIZE`, `MPI_LOCALRANKID`,
        `MPI_LOCALNRANKS`), Open MPI (`OMPI_COMM_WORLD_*`), PMIx (`PMIX_*`)
        and Slurm (`SLURM_PROCID`, ...). Where the launcher's variables give
        no local rank (`srun --mpi=pmi2` sets `PMI_RANK` without
        `MPI_LOCALRANKID`), it comes from another launcher's for the same
        rank and size (`SLURM_LOCALID`), else it is 0 of 1. mpi4py is not
        imported.

        Args:
            environ: the variables to read (default: `os.environ`).
            require: raise `NotLaunchedError` instead of returning the
                single-process config when no launcher variables are set.
            collective_timeout: copied into the config (see the class).

        Returns:
            The config, with `backend="mpi"` when launched by an MPI launcher
            (even with one rank), else `DistributedTrainConfig()` (world of
            one, `backend="none"`).

        Raises:
            NotLaunchedError: `require` is true and no launcher variables are set.
            ValueError: the variables are malformed or inconsistent.
        """
        env = os.environ if environ is None else environ
        for name, rank_var, size_var, _, _ in _LAUNCHERS:
            if rank_var not in env or size_var not in env:
                continue
            rank = _read_int(env, rank_var, name)
            size = _read_int(env, size_var, name)
            local, local_size = _local_place(env, rank, size)
            try:
                return cls(
                    world_size=size,
                    rank=rank,
                    local_rank=local,
                    local_world_size=min(local_size, size),
                    backend="mpi",
                    collective_timeout=collective_timeout,
                )
            except ValueError as exc:
                raise ValueError(f"inconsistent {name} launcher variables: {exc}") from None
        if require:
            raise NotLaunchedError(
                "not launched by an MPI launcher (no PMI_RANK/OMPI_COMM_WORLD_RANK/"
                "PMIX_RANK/SLURM_PROCID): start the job with `atomr launch -n N -- ...` "
                "or `mpiexec -n N ...`"
            )
        return cls(collective_timeout=collective_timeout)


def _read_int(env: Mapping[str, str], var: str, launcher: str, *, slurm_count: bool = False) -> int:
    """`int(env[var])`, or a `ValueError` naming the variable. With
    `slurm_count`, Slurm's per-node form "2(x3)" reads as 2."""
    raw = env[var]
    try:
        return int(raw.split("(")[0] if slurm_count else raw)
    except ValueError:
        raise ValueError(
            f"malformed {launcher} launcher variable {var}={raw!r}: expected an integer"
        ) from None


def _local_place(env: Mapping[str, str], rank: int, size: int) -> tuple[int, int]:
    """(local rank, local world size) of this process.

    From the first launcher, in `_LAUNCHERS` order, that sets a local rank
    for the same place in the job (same rank and size): under
    `srun --mpi=pmi2` the PMI variables carry no local rank, Slurm's do.
    Without one: local rank 0 of 1. An unset local size reads as
    `local rank + 1`.
    """
    for name, rank_var, size_var, local_var, local_size_var in _LAUNCHERS:
        if not {rank_var, size_var, local_var} <= env.keys():
            continue
        try:
            same = (int(env[rank_var]), int(env[size_var])) == (rank, size)
        except ValueError:
            same = False
        if not same:
            continue  # another job's (or a stale) launcher variables
        local = _read_int(env, local_var, name)
        local_size = 0
        if env.get(local_size_var):
            local_size = _read_int(env, local_size_var, name, slurm_count=True)
        return local, local_size if local_size > 0 else max(local + 1, 1)
    return 0, 1


def shard_for_rank(n_samples: int, rank: int, world_size: int) -> slice:
    """The contiguous part of a global batch that `rank` trains on.

    The rank's piece of `split_bounds(n_samples, world_size)`: the first
    `n_samples % world_size` ranks get `n_samples // world_size + 1`
    samples, the others `n_samples // world_size`; the shards, taken in rank
    order, tile `range(n_samples)` exactly. With fewer samples than ranks the
    last ranks get empty slices.

    Args:
        n_samples: size of the global batch, >= 0.
        rank: in `[0, world_size)`.
        world_size: >= 1.

    Returns:
        `slice(start, stop)` into the global batch.

    Raises:
        ValueError: an argument is out of range.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    if n_samples < 0:
        raise ValueError(f"n_samples must be >= 0, got {n_samples}")
    lo, hi = split_bounds(n_samples, world_size)[rank]
    return slice(lo, hi)
