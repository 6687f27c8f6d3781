"""Run under `mpiexec -n N`: every MpiCollective operation against a reference.

Each rank draws the same random buffers for every rank (seeded), so it can
compute the reference of the whole group by itself (HostCollective, and the
float64 NumPy sum) and compare with what MPI returned. Sizes include ones
the group does not divide, and ones shorter than the group (empty chunks).
Writes `rank{r}.json` with the checks into OUT_DIR (argv[1]); exits non-zero
on the first mismatch.
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
from atomr.train.core.partition import split_bounds

SIZES = [1, 2, 7, 1000, 65_537]


def contributions(round_: int, world: int, n: int, dtype: type) -> list[np.ndarray]:
    rng = np.random.default_rng(1000 + round_)
    return [rng.standard_normal(n).astype(dtype) for _ in range(world)]


def float64_sum(parts: list[np.ndarray]) -> np.ndarray:
    return np.sum(np.stack(parts).astype(np.float64), axis=0)


def close(got: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=1e-5, atol=1e-5)


async def reduce_scatter_checks(coll: MpiCollective, parts: list[np.ndarray]) -> None:
    """This rank's chunk of the sum, in place at its own positions; with two
    local buffers; and the mean."""
    rank, world = coll.rank, coll.world_size
    lo, hi = split_bounds(parts[0].size, world)[rank]
    want = float64_sum(parts)[lo:hi]
    mine = parts[rank].copy()
    chunk = await coll.reduce_scatter(mine)
    assert chunk.size == hi - lo and (chunk.size == 0 or np.shares_memory(chunk, mine))
    assert chunk.tobytes() == mine[lo:hi].tobytes()
    close(chunk, want)
    two = [parts[rank].copy(), parts[rank] * 2]  # the group has 2 * world contributions
    close(await coll.reduce_scatter(two), want * 3)
    close(await coll.reduce_scatter([parts[rank].copy()], op="mean"), want / world)


async def all_gather_checks(coll: MpiCollective, parts: list[np.ndarray]) -> None:
    """Every rank ends with chunk k of rank k, bit for bit, in every local
    buffer; the positions a rank does not own are never read (NaN)."""
    n, rank = parts[0].size, coll.rank
    bounds = split_bounds(n, coll.world_size)
    expected = np.empty_like(parts[0])
    for k, (lo, hi) in enumerate(bounds):
        expected[lo:hi] = parts[k][lo:hi]
    mine = np.full_like(parts[0], np.nan)
    lo, hi = bounds[rank]
    mine[lo:hi] = parts[rank][lo:hi]
    local = [mine, np.zeros_like(mine)]
    await coll.all_gather(local)
    for have in local:
        assert have.tobytes() == expected.tobytes()


COPIED = (np.bool_, np.int8, np.int64, np.uint16, np.float16, np.complex128)
"""Dtypes the copies take besides the floats the sums take (`check_dtype`)."""


async def copies_of_every_dtype(coll: MpiCollective) -> None:
    """broadcast and all_gather move every copied dtype bit for bit, as the
    host collective does."""
    world, rank = coll.world_size, coll.rank
    for dtype in COPIED:
        parts = [(np.arange(7) * world + k).astype(dtype) for k in range(world)]
        for root in range(world):
            local = [parts[rank].copy(), np.zeros(7, dtype)]
            await coll.broadcast(local, root=root)
            assert all(have.tobytes() == parts[root].tobytes() for have in local)
        await all_gather_checks_exact(coll, parts)


async def all_gather_checks_exact(coll: MpiCollective, parts: list[np.ndarray]) -> None:
    """Every rank ends with chunk k of rank k, in every local buffer."""
    bounds = split_bounds(parts[0].size, coll.world_size)
    expected = np.empty_like(parts[0])
    for k, (lo, hi) in enumerate(bounds):
        expected[lo:hi] = parts[k][lo:hi]
    local = [parts[coll.rank].copy(), np.zeros_like(parts[0])]
    await coll.all_gather(local)
    assert all(have.tobytes() == expected.tobytes() for have in local)


async def scatter_and_gather(coll: MpiCollective) -> str:
    """reduce_scatter and all_gather for every size and dtype; returns a
    digest of a reduce_scatter then all_gather (the same on every rank)."""
    world = coll.world_size
    for k, n in enumerate(SIZES):
        for dtype in (np.float32, np.float64):
            parts = contributions(50 + k, world, n, dtype)
            await reduce_scatter_checks(coll, parts)
            await all_gather_checks(coll, parts)
    parts = contributions(98, world, 4099, np.float32)
    mine = parts[coll.rank].copy()
    await coll.reduce_scatter(mine)
    await coll.all_gather(mine)
    close(mine, float64_sum(parts))
    return mine.tobytes().hex()[:64] + str(float(mine.sum()))


async def main(out_dir: Path) -> None:
    config = DistributedTrainConfig.from_environment(require=True, collective_timeout=30.0)
    coll = MpiCollective.from_config(config)
    host = HostCollective()
    rank, world = coll.rank, coll.world_size
    checks: dict[str, object] = {"rank": rank, "world_size": world}
    for k, n in enumerate(SIZES):
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
    checks["phased_digest"] = await scatter_and_gather(coll)
    checks["reduce_scatter_and_all_gather"] = "ok"
    await copies_of_every_dtype(coll)
    checks["copies_of_every_dtype"] = "ok"
    # every rank ends with identical bits
    probe = contributions(99, world, 4096, np.float32)[rank]
    await coll.all_reduce(probe)
    checks["digest"] = probe.tobytes().hex()[:64] + str(float(probe.sum()))
    # barrier: the last rank to arrive is late by 0.3 s; nobody leaves before it
    if rank == world - 1:
        await asyncio.sleep(0.3)  # the late rank: the scenario under test
    before = time.time()
    await coll.barrier()
    checks["barrier_left_at"] = time.time()
    checks["barrier_entered_at"] = before
    # the loop keeps running while a collective is in flight
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.001)  # one tick of the loop-liveness probe
            ticks += 1

    task = asyncio.create_task(ticker())
    if rank == 0:
        await asyncio.sleep(0.2)  # rank 0 comes late: the others wait in the barrier
    await coll.barrier()
    task.cancel()
    checks["ticks_during_barrier"] = ticks
    coll.close()
    host.close()
    (out_dir / f"rank{rank}.json").write_text(json.dumps(checks))


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
