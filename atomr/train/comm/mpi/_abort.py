"""`abort_job`: how a rank ends the whole job (`MpiCollective.abort`), after
a collective failed or when the program gives up."""

from __future__ import annotations

import os
import sys
import time
from typing import Any, NoReturn

from atomr._arguments import int_at_least
from atomr.actor.timers import check_delay

__all__ = ["abort_job"]


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
