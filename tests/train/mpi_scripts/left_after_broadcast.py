"""Run under `mpiexec -n 4`: a root that reports a failure right after its
broadcast, while a receiver still waits for the data from a late rank.

MPICH broadcasts a small buffer along a binomial tree: rank 0 (the root)
sends to ranks 2 and 1, and rank 2 forwards to rank 3. Rank 2 joins the
broadcast 1 s late, so rank 3 parks on it; rank 0's own part is done at
once, and it then calls `report_failure`. The broadcast needs nothing more
from rank 0, so every receiver must complete it (rank 3 included, once
rank 2 forwards the data), and fail only at its next operation (a
barrier), naming rank 0. `check_order=False`, so that the late rank
holds back only the broadcast, not a check that rank 0 waits for too.

argv: OUT_DIR [serialized: every rank's MPI says it gives
`MPI_THREAD_SERIALIZED` only, `Query_thread` faked]. Rank r != 0 writes `rank{r}.json`: the broadcast's outcome
("ok" with the data right, or the error), the barrier's error, and how long
it took; rank 0 waits (up to 60 s) for those files, then every rank leaves
with `os._exit(0)` (MPI cannot be finalised with broken collectives).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

from atomr.train.comm.mpi.collective import CollectiveError, MpiCollective

ROOT_DATA = 42.0


async def receiver(coll: MpiCollective, out: Path) -> None:
    report: dict[str, object] = {}
    buf = np.zeros(8, dtype=np.float64)
    if coll.rank == 2:
        await asyncio.sleep(1.0)  # the late rank that rank 3's data goes through
    try:
        await coll.broadcast(buf, root=0)
        report["broadcast"] = "ok" if np.all(buf == ROOT_DATA) else f"wrong data {buf.tolist()}"
    except CollectiveError as exc:
        report["broadcast"] = f"{type(exc).__name__}: {exc}"
    started = time.monotonic()
    try:
        await coll.barrier()
        report["next"] = "no error"
    except CollectiveError as exc:
        report["next"] = f"{type(exc).__name__}: {exc}"
    report["next_s"] = time.monotonic() - started
    (out / f"rank{coll.rank}.json").write_text(json.dumps(report))


async def root(coll: MpiCollective, out: Path) -> None:
    await coll.broadcast(np.full(8, ROOT_DATA), root=0)  # rank 0's part completes at once
    coll.report_failure()
    deadline = time.monotonic() + 60.0
    files = [out / f"rank{r}.json" for r in range(1, coll.world_size)]
    while not all(f.exists() for f in files) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)  # polls for the receivers' reports


async def main(out: Path) -> None:
    coll = MpiCollective(timeout=20.0, check_order=False)
    await coll.barrier()  # every rank in step before the scenario
    await (root(coll, out) if coll.rank == 0 else receiver(coll, out))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    if sys.argv[2:] == ["serialized"]:
        MPI.Query_thread = lambda: MPI.THREAD_SERIALIZED
    asyncio.run(main(Path(sys.argv[1])))
