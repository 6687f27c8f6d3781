"""The errors of collectives across processes (`MpiCollective`), and
`abort_job`, how a rank ends the job after one."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from typing import Any, NoReturn

from atomr._arguments import int_at_least
from atomr.actor.timers import check_delay

__all__ = [
    "CollectiveError",
    "CollectiveMismatchError",
    "CollectiveTimeoutError",
    "RankFailedError",
    "abort_job",
]


class CollectiveError(RuntimeError):
    """A collective across processes failed; the group can no longer be used.

    Attributes:
        ranks: the other ranks the failure names (each subclass says which).
        operation: what failed, e.g. "all_reduce #12".
    """

    def __init__(self, message: str, ranks: Sequence[int] = (), operation: str = "") -> None:
        super().__init__(message)
        self.ranks = tuple(ranks)
        self.operation = operation


class RankFailedError(CollectiveError):
    """A collective failed because one or more ranks did not take part.

    Attributes:
        ranks: the ranks that never joined the failed operation (empty when
            every rank had joined and the operation failed inside MPI).
        operation: what failed, e.g. "all_reduce #12".
    """


class CollectiveTimeoutError(RankFailedError, TimeoutError):
    """A collective did not complete within the collective's timeout; `ranks`
    names the ranks that never joined it."""


class CollectiveMismatchError(CollectiveError):
    """The ranks reached different operations (another kind, element count,
    dtype, root, mean, purpose or number): no rank ran it, and the collective
    can no longer be used. Every rank raises it, with the same list of operations.

    Attributes:
        operations: each rank's operation in words, by rank, e.g.
            "all_reduce #7 (1024 float32)".
        ranks: the ranks whose operation differs from this rank's.
        operation: this rank's operation, e.g. "all_reduce #7".
    """

    def __init__(
        self,
        message: str,
        operations: Sequence[str] = (),
        ranks: Sequence[int] = (),
        operation: str = "",
    ) -> None:
        super().__init__(message, ranks, operation)
        self.operations = tuple(operations)


def abort_job(mpi: Any, rank: int, errorcode: int, message: str | None, grace: float) -> NoReturn:
    """`MpiCollective.abort`: print `message` (prefixed with `rank`), wait
    `grace` seconds, then `MPI_Abort` on `mpi.COMM_WORLD` with `errorcode`.

    Raises:
        TypeError, ValueError: `errorcode` is not an int from 0 to 255 (a
            bool is not; 256 would end the job with status 0), or `grace`
            is not a finite number of seconds >= 0: before anything is
            printed or aborted.
    """
    errorcode = int_at_least("errorcode", errorcode, 0, high=255)
    pause = check_delay("grace", grace, allow_zero=True, finite=True)
    if message:
        print(f"[rank {rank}] {message}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    time.sleep(pause)
    # MPICH's launcher ends every process only for an abort on COMM_WORLD.
    mpi.COMM_WORLD.Abort(errorcode)
    os._exit(errorcode)  # MPI_Abort may return before the launcher acts
