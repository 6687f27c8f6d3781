"""Run under `mpiexec -n N`: MpiCollective while operations are in flight.

Checks, in order (the last rank is the late one where lateness matters):

- concurrent: four operations submitted at once by four tasks run in
  submission order with the right results;
- late peer: an all_reduce whose last rank joins 0.3 s late (the operation
  is tested from the loop, then parked on the MPI thread) is right, and the
  event loop keeps ticking meanwhile (the longest gap between 1 ms ticks);
- cancelled caller: the caller of an operation in flight is cancelled; the
  operation still completes (every rank runs it) and the next one is right;
- heavy local work: several local buffers of over 1 MiB (summed and divided
  on the MPI thread), broadcast into several buffers;
- stopped loop: an event loop that ends while an operation of a second
  collective is in flight breaks that collective with a clear error.

Writes `rank{r}.json` into OUT_DIR (argv[1]); exits non-zero on a mismatch.
With "serialized" as argv[2], every rank's MPI says it gives
`MPI_THREAD_SERIALIZED` only (`Query_thread` faked): parked operations are
then waited for by testing them and the failure notes in turn on the MPI
thread (`FailureNotes.wait_watching`).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

from atomr.train.comm.mpi.collective import MpiCollective, RankFailedError


def parts(seed: int, world: int, n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(n).astype(np.float32) for _ in range(world)]


def close(got: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


async def concurrent(coll: MpiCollective, checks: dict[str, object]) -> None:
    rank, world = coll.rank, coll.world_size
    a, b, c = parts(1, world, 1000), parts(2, world, 77), parts(3, world, 5000)
    mine_a = a[rank].copy()
    mine_b = b[rank].copy()
    mine_c = [c[rank].copy(), c[rank] * 2]
    await asyncio.gather(
        coll.all_reduce(mine_a),
        coll.broadcast(mine_b, root=world - 1),
        coll.all_reduce(mine_c, op="mean"),
        coll.barrier(),
    )
    close(mine_a, np.sum(a, axis=0))
    np.testing.assert_array_equal(mine_b, b[world - 1])
    close(mine_c[0], np.sum(c, axis=0) * 3 / (2 * world))
    checks["concurrent"] = "ok"


async def late_peer(coll: MpiCollective, checks: dict[str, object]) -> None:
    rank, world = coll.rank, coll.world_size
    data = parts(4, world, 65_537)
    mine = data[rank].copy()
    ticks: list[float] = []

    async def ticker() -> None:
        while True:
            ticks.append(time.monotonic())
            await asyncio.sleep(0.001)  # one tick of the loop-liveness probe

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.01)  # a few ticks before the collective starts
    if rank == world - 1:
        await asyncio.sleep(0.3)  # the late peer: the scenario under test
    await coll.all_reduce(mine)
    task.cancel()
    close(mine, np.sum(data, axis=0))
    checks["late_peer"] = "ok"
    checks["late_peer_ticks"] = len(ticks)
    checks["late_peer_max_tick_gap_s"] = float(np.max(np.diff(ticks)))


async def cancelled_caller(coll: MpiCollective, checks: dict[str, object]) -> None:
    rank, world = coll.rank, coll.world_size
    first, second = parts(5, world, 3000), parts(6, world, 3000)
    mine_first, mine_second = first[rank].copy(), second[rank].copy()
    if rank == world - 1:
        await asyncio.sleep(0.3)  # the late peer keeps the others' operation in flight
    caller = asyncio.create_task(coll.all_reduce(mine_first))
    await asyncio.sleep(0.05)  # the caller is cancelled mid-operation (checked on on-time ranks)
    was_in_flight = not caller.done()
    caller.cancel()
    await coll.all_reduce(mine_second)  # queued behind the cancelled caller's operation
    close(mine_first, np.sum(first, axis=0))
    close(mine_second, np.sum(second, axis=0))
    checks["cancelled_caller"] = "ok"
    checks["cancelled_in_flight"] = was_in_flight


async def heavy_local_work(coll: MpiCollective, checks: dict[str, object]) -> None:
    rank, world = coll.rank, coll.world_size
    n = 300_000  # 1.2 MB a buffer: summed and divided on the MPI thread
    data = parts(7, world, n)
    mine = [data[rank].copy(), data[rank].copy()]
    await coll.all_reduce(mine, op="mean")
    close(mine[0], np.sum(data, axis=0) / world)
    local = [data[rank].copy(), np.zeros(n, np.float32), np.zeros(n, np.float32)]
    await coll.broadcast(local, root=0)
    for buffer in local:
        np.testing.assert_array_equal(buffer, data[0])
    checks["heavy_local_work"] = "ok"


def stopped_loop(checks: dict[str, object]) -> None:
    coll = MpiCollective(timeout=30.0)  # collective: every rank makes it here
    rank, world = coll.rank, coll.world_size
    buf = np.ones(1000, np.float32)

    async def abandon() -> None:
        asyncio.create_task(coll.all_reduce(buf))
        await asyncio.sleep(0.1)  # returns with the operation parked: the loop stops

    async def join_late() -> None:
        await asyncio.sleep(0.5)  # joins after the other loop stopped: the scenario under test
        await coll.all_reduce(buf)

    async def use_again() -> str:
        try:
            await coll.all_reduce(np.ones(3, np.float32))
        except RankFailedError as exc:
            return str(exc)
        return "no error"

    if rank == 0:
        asyncio.run(abandon())
        checks["stopped_loop_error"] = asyncio.run(use_again())
    else:
        asyncio.run(join_late())  # rank 0's operation completes on its MPI thread
        checks["stopped_loop_error"] = None
        if buf[0] != world:
            raise AssertionError(f"abandoned all_reduce gave {buf[0]}, want {world}")
    MPI.COMM_WORLD.Barrier()
    coll.close()


async def main(checks: dict[str, object]) -> None:
    coll = MpiCollective(timeout=30.0)
    checks.update(rank=coll.rank, world_size=coll.world_size)
    await concurrent(coll, checks)
    await late_peer(coll, checks)
    await cancelled_caller(coll, checks)
    await heavy_local_work(coll, checks)
    coll.close()


if __name__ == "__main__":
    if sys.argv[2:] == ["serialized"]:
        MPI.Query_thread = lambda: MPI.THREAD_SERIALIZED
    results: dict[str, object] = {}
    asyncio.run(main(results))
    stopped_loop(results)
    out = Path(sys.argv[1]) / f"rank{results['rank']}.json"
    out.write_text(json.dumps(results))
