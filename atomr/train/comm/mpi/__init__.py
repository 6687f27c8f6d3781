"""Training across processes: the MPI collective, the rank's place in a job, and
the `mpiexec` launcher. Importing this package does not import mpi4py (the
collective imports it when one is built)."""

from atomr.train.comm.mpi.collective import MpiCollective
from atomr.train.comm.mpi.errors import (
    CollectiveError,
    CollectiveMismatchError,
    CollectiveTimeoutError,
    RankFailedError,
)
from atomr.train.comm.mpi.job import DistributedTrainConfig, NotLaunchedError, shard_for_rank

__all__ = [
    "CollectiveError",
    "CollectiveMismatchError",
    "CollectiveTimeoutError",
    "DistributedTrainConfig",
    "MpiCollective",
    "NotLaunchedError",
    "RankFailedError",
    "shard_for_rank",
]
