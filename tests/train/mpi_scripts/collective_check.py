"""Run under `mpiexec -n N`: every MpiCollective operation against HostCollective.

Each rank draws the same random buffers for every rank (seeded), so it can
compute the HostCollective reference of the whole group by itself and compare
with what MPI returned. Writes `rank{r}.json` with the checks into OUT_DIR
(argv[1]); exits non-zero on the first mismatch.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import numpy as np

from atomr.train.comm.collective import HostCollective
from atomr.train.comm.mpi.collective import MpiCollective
from atomr.train.comm.mpi.job import DistributedTrainConfig


def contributions(round_: int, world: int, n: int, dtype: type) -> list[np.ndarray]:
    rng = np.random.default_rng(1000 + round_)
    return [rng.standard_normal(n).astype(dtype) for _ in range(world)]


async def main(out_dir: Path) -> None:
    config = DistributedTrainConfig.from_environment(require=True, collective_timeout=30.0)
    coll = MpiCollective.from_config(config)
    host = HostCollective()
    rank, world = coll.rank, coll.world_size
    checks: dict[str, object] = {"rank": rank, "world_size": world}
    sizes = [1, 7, 1000, 65_537]
    for k, n in enumerate(sizes):
        for dtype in (np.float32, np.float64):
            parts = contributions(k, world, n, dtype)
            ref = (await host.all_reduce(parts)).copy()
            mine = parts[rank].copy()
            got = await coll.all_reduce(mine)
            assert got is mine, "all_reduce must work in place"
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
            mine = parts[rank].copy()
            got = await coll.all_reduce([mine], op="mean")
            np.testing.assert_allclose(got, ref / world, rtol=1e-5, atol=1e-5)
            # two local buffers per rank: the group has 2 * world contributions
            two = [parts[rank].copy(), parts[rank] * 2]
            ref2 = (await host.all_reduce(parts)).copy() * 3
            got = await coll.all_reduce(two)
            np.testing.assert_allclose(got, ref2, rtol=1e-5, atol=1e-5)
            # broadcast from every root, into two local buffers
            for root in range(world):
                local = [parts[rank].copy(), np.zeros(n, dtype)]
                expect = [parts[root].copy(), parts[root].copy()]
                await host.broadcast(expect, root=0)
                await coll.broadcast(local, root=root)
                for have, want in zip(local, expect, strict=True):
                    np.testing.assert_array_equal(have, want)
    checks["all_reduce_and_broadcast"] = "ok"
    # every rank ends with identical bits
    probe = contributions(99, world, 4096, np.float32)[rank]
    await coll.all_reduce(probe)
    checks["digest"] = probe.tobytes().hex()[:64] + str(float(probe.sum()))
    # barrier: the last rank to arrive is late by 0.3 s; nobody leaves before it
    if rank == world - 1:
        await asyncio.sleep(0.3)
    before = time.time()
    await coll.barrier()
    checks["barrier_left_at"] = time.time()
    checks["barrier_entered_at"] = before
    # the loop keeps running while a collective is in flight
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.001)
            ticks += 1

    task = asyncio.create_task(ticker())
    if rank == 0:
        await asyncio.sleep(0.2)
    await coll.barrier()
    task.cancel()
    checks["ticks_during_barrier"] = ticks
    coll.close()
    host.close()
    (out_dir / f"rank{rank}.json").write_text(json.dumps(checks))


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
