"""Run under `mpiexec -n N`: one rank fails mid-run, the others must report it.

argv: MODE VICTIM TIMEOUT [OPERATION], MODE in {"exit", "hang", "kill",
"report", "report-serialized"}: at operation 5 the VICTIM rank leaves with
`os._exit(3)`, stops taking part (sleeps forever), is killed by SIGKILL
(sent to itself: no Python cleanup, no exit handler, as the kernel's OOM
killer would), or says it failed (`report_failure`) and then stops taking
part; "report-serialized" does so where every rank's MPI says it gives
`MPI_THREAD_SERIALIZED` only (`Query_thread` faked), so that the notes go
through the MPI threads. The survivors'
OPERATION ("all_reduce", "reduce_scatter" or "all_gather"; default
all_reduce) times out after TIMEOUT seconds with an error naming the victim
(after a report: fails at once, naming it); each then calls
`report_failure` twice on its broken collective (which must be harmless:
quick, raising nothing, the collective's error kept) and says how that went,
and they print the error and abort the job.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import numpy as np

from atomr.train.comm.mpi.collective import CollectiveError, MpiCollective, RankFailedError


async def run_one(coll: MpiCollective, operation: str, buf: np.ndarray) -> None:
    """One operation on a buffer of ones, checked."""
    buf.fill(1.0)
    if operation == "all_reduce":
        assert (await coll.all_reduce(buf))[0] == coll.world_size
    elif operation == "reduce_scatter":
        assert (await coll.reduce_scatter(buf))[0] == coll.world_size
    else:
        await coll.all_gather(buf)
        assert buf[-1] == 1.0


async def report_after(coll: MpiCollective, error: CollectiveError) -> None:
    """`report_failure` twice on the collective `error` broke; prints how
    long that took and whether a later call still raises `error`."""
    started = time.monotonic()
    coll.report_failure()
    coll.report_failure()
    took = time.monotonic() - started
    try:
        await coll.barrier()
        kept = False
    except RankFailedError as later:
        kept = str(error) in str(later)
    print(f"[rank {coll.rank}] report_failure after the failure: {took:.2f} s, "
          f"the error kept: {kept}", flush=True)  # fmt: skip


async def main(mode: str, victim: int, timeout: float, operation: str) -> None:
    if mode == "report-serialized":
        from mpi4py import MPI

        MPI.Query_thread = lambda: MPI.THREAD_SERIALIZED
    coll = MpiCollective(timeout=timeout)
    buf = np.ones(10_000, dtype=np.float32)
    try:
        for step in range(1000):
            if step == 5 and coll.rank == victim:
                print(f"[rank {coll.rank}] failing now ({mode})", flush=True)
                if mode == "exit":
                    os._exit(3)
                if mode == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                if mode.startswith("report"):
                    coll.report_failure()
                await asyncio.sleep(3600)
            await run_one(coll, operation, buf)
    except CollectiveError as exc:
        await report_after(coll, exc)
        coll.abort(2, f"{type(exc).__name__}: {exc}")
    print(f"[rank {coll.rank}] finished without noticing the failure", flush=True)
    sys.exit(1)


if __name__ == "__main__":
    operation = sys.argv[4] if len(sys.argv) > 4 else "all_reduce"
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), operation))
