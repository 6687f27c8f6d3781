"""Run under `mpiexec -n N`: one rank fails mid-run, the others must report it.

argv: MODE VICTIM TIMEOUT, MODE in {"exit", "hang", "kill"}: at operation 5
the VICTIM rank leaves with `os._exit(3)`, stops taking part (sleeps
forever), or is killed by SIGKILL (sent to itself: no Python cleanup, no
exit handler, as the kernel's OOM killer would). The survivors' all_reduce
times out after TIMEOUT seconds with an error naming the victim; they print
it and abort the job.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import numpy as np

from atomr.train.comm.mpi.collective import CollectiveError, MpiCollective


async def main(mode: str, victim: int, timeout: float) -> None:
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
                await asyncio.sleep(3600)
            buf.fill(1.0)
            await coll.all_reduce(buf)
            assert buf[0] == coll.world_size
    except CollectiveError as exc:
        coll.abort(2, f"{type(exc).__name__}: {exc}")
    print(f"[rank {coll.rank}] finished without noticing the failure", flush=True)
    sys.exit(1)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3])))
