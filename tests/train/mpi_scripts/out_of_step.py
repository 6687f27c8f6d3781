"""Run under `mpiexec -n N`: ranks that issue different operations.

Each scenario makes a fresh `MpiCollective` (timeout TIMEOUT, argv[2]),
runs two matching all_reduces, then has rank 1 issue something else than
the other ranks:

- kind: rank 1 broadcasts (root 0) where the others all_reduce;
- size: rank 1 all_reduces 2048 elements where the others all_reduce 1024,
  0.1 s late (the others' exchange is parked);
- ahead: all_reduces of 100, 200, 300 elements submitted at once (queued),
  where rank 1 skipped the first (it is one operation ahead);
- dtype: rank 1 all_gathers float64 where the others all_gather float32;
- purpose: after one all_reduce for "step" on every rank (it runs), rank 1
  all_reduces the same 1024 float32 for "save checkpoint" where the others
  all_reduce for "step";
- op: rank 1 all_reduces with op="mean" where the others sum (each rank
  would end with other bits);
- contributions: every rank reduce_scatters with op="mean", rank 1 from two
  local buffers, the others from one (each would divide by its own count).

For each it records the error every rank raised, how long it took, whether
the buffers were left untouched (no rank ran the operation), and what a
later call raised. Then: `check_order` off on rank 1 only (every rank must
refuse), and off on every rank (results still right). Writes
`rank{r}.json` into OUT_DIR (argv[1]).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from atomr.train.comm.mpi.collective import CollectiveError, MpiCollective
from atomr.train.comm.purpose import purpose


async def diverge(coll: MpiCollective, scenario: str) -> np.ndarray:
    """The scenario's operation on this rank; returns the buffer it used."""
    odd = coll.rank == 1
    if scenario == "kind":
        buf = np.full(1024, 5.0, np.float32)
        await (coll.broadcast(buf, root=0) if odd else coll.all_reduce(buf))
    elif scenario == "size":
        buf = np.full(2048 if odd else 1024, 5.0, np.float32)
        if odd:  # late: the others' exchange is parked, and checked by the driver task
            await asyncio.sleep(0.1)  # the late rank: the scenario under test
        await coll.all_reduce(buf)
    elif scenario == "ahead":  # submitted at once: queued behind each other
        bufs = [np.full(n, 5.0, np.float32) for n in ((200, 300) if odd else (100, 200, 300))]
        done = await asyncio.gather(*map(coll.all_reduce, bufs), return_exceptions=True)
        buf = np.concatenate(bufs)
        for outcome in done:
            if isinstance(outcome, BaseException):
                raise outcome
    elif scenario == "dtype":
        buf = np.full(1024, 5.0, np.float64 if odd else np.float32)
        await coll.all_gather(buf)
    elif scenario == "op":
        buf = np.full(1024, 5.0, np.float32)
        await coll.all_reduce(buf, op="mean" if odd else "sum")
    elif scenario == "contributions":
        buf = np.full(1024, 5.0, np.float32)
        await coll.reduce_scatter([buf, np.ones(1024, np.float32)] if odd else buf, op="mean")
    else:
        with purpose("step"):  # the same purpose everywhere: it runs
            assert (await coll.all_reduce(np.ones(1024, np.float32)))[0] == coll.world_size
        buf = np.full(1024, 5.0, np.float32)
        with purpose("save checkpoint" if odd else "step"):
            await coll.all_reduce(buf)
    return buf


async def scenario_report(scenario: str, timeout: float) -> dict[str, Any]:
    coll = MpiCollective(timeout=timeout)
    for _ in range(2):
        assert (await coll.all_reduce(np.ones(16, np.float32)))[0] == coll.world_size
    started = time.monotonic()
    report: dict[str, Any] = {}
    buf = np.full(1, 5.0, np.float32)
    try:
        buf = await diverge(coll, scenario)
        report["error"] = None
    except CollectiveError as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"
        report["operations"] = list(getattr(exc, "operations", ()))
        report["ranks"] = list(getattr(exc, "ranks", ()))
        report["operation"] = getattr(exc, "operation", "")
    report["elapsed_s"] = time.monotonic() - started
    report["untouched"] = bool(np.all(buf == 5.0))
    report["broken"] = coll.broken
    later = time.monotonic()
    try:
        await coll.barrier()
        report["later"] = "no error"
    except CollectiveError as exc:
        report["later"] = f"{type(exc).__name__}: {exc}"
    report["later_s"] = time.monotonic() - later
    coll.close()
    return report


async def options_report() -> dict[str, Any]:
    report: dict[str, Any] = {}
    try:
        MpiCollective(timeout=10.0, check_order=coll_rank() != 1)
        report["disagreeing_option"] = "accepted"
    except ValueError as exc:
        report["disagreeing_option"] = str(exc)
    coll = MpiCollective(timeout=10.0, check_order=False)
    buf = np.arange(1000, dtype=np.float32)
    await coll.all_reduce(buf)
    report["unchecked_sum_ok"] = bool(np.all(buf == np.arange(1000) * coll.world_size))
    coll.close()
    return report


def coll_rank() -> int:
    from mpi4py import MPI

    return int(MPI.COMM_WORLD.Get_rank())


async def main(out_dir: Path, timeout: float) -> None:
    results: dict[str, Any] = {}
    for scenario in ("kind", "size", "ahead", "dtype", "purpose", "op", "contributions"):
        results[scenario] = await scenario_report(scenario, timeout)
    results.update(await options_report())
    (out_dir / f"rank{coll_rank()}.json").write_text(json.dumps(results))


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), float(sys.argv[2])))
