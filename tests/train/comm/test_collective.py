"""Collectives: HostCollective (the reference sum) and the ring all-reduce
between actors (reduce-scatter + all-gather, broadcast, abort on failure)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from atomr import Actor, Props
from atomr.train.comm.collective import Collective, HostCollective
from atomr.train.comm.ring import RingAllReduce, RingMember, chunk_bounds


def _buffers(n: int, size: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(size).astype(np.float32) for _ in range(n)]


# ---------------------------------------------------------------- host


@pytest.mark.parametrize("n", [1, 2, 3, 4])
async def test_host_all_reduce_is_the_sum(n: int) -> None:
    bufs = _buffers(n, 1001)
    before = [b.copy() for b in bufs]
    host = HostCollective()
    out = await host.all_reduce(bufs)
    expected = np.sum(np.stack(before).astype(np.float64), axis=0)
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)
    for b, orig in zip(bufs, before, strict=True):  # inputs untouched
        np.testing.assert_array_equal(b, orig)
    host.close()


@pytest.mark.parametrize("n", [1, 2, 3])
async def test_host_all_reduce_scaled_equals_sum_then_scale(n: int) -> None:
    bufs = _buffers(n, 1001, seed=3)
    host = HostCollective()
    plain = (await host.all_reduce(bufs)).copy()
    plain *= np.float32(0.25)
    out, sumsq = await host.all_reduce_scaled(bufs, 0.25)
    np.testing.assert_array_equal(out, plain)
    assert sumsq == pytest.approx(float(np.sum(plain.astype(np.float64) ** 2)), rel=1e-9)
    assert host.last_squared_norm == sumsq
    host.close()


async def test_host_all_reduce_reuses_its_output_buffer() -> None:
    host = HostCollective()
    first = await host.all_reduce(_buffers(2, 64, seed=1))
    second = await host.all_reduce(_buffers(2, 64, seed=2))
    assert first is second  # one output per shape/dtype, no per-call allocation
    other = await host.all_reduce(_buffers(2, 65))
    assert other is not first
    host.close()


async def test_host_all_reduce_rejects_bad_buffers() -> None:
    host = HostCollective()
    with pytest.raises(ValueError, match="at least one"):
        await host.all_reduce([])
    with pytest.raises(ValueError, match="must match"):
        await host.all_reduce([np.zeros(3, np.float32), np.zeros(4, np.float32)])
    with pytest.raises(TypeError, match="numpy array"):
        await host.all_reduce([np.zeros(3, np.float32), [1.0, 2.0, 3.0]])
    with pytest.raises(TypeError, match="list of arrays"):
        await host.all_reduce(np.zeros(3, np.float32))
    host.close()


async def test_host_broadcast_and_barrier() -> None:
    host = HostCollective()
    bufs = _buffers(3, 50)
    root = bufs[2].copy()
    await host.broadcast(bufs, root=2)
    for b in bufs:
        np.testing.assert_array_equal(b, root)
    with pytest.raises(IndexError):
        await host.broadcast(bufs, root=3)
    await host.barrier()
    assert isinstance(host, Collective)
    host.close()


# ---------------------------------------------------------------- ring


class BufferActor(Actor):
    """A minimal ring member: a NumPy buffer, optionally failing on `add_chunk`.

    With `lend_views` it reads chunks as views of its buffer (as a CPU
    `ReplicaActor` does) and takes a random 0-2 ms before each change, so
    the members' steps interleave in many orders.
    """

    def __init__(
        self, data: np.ndarray, fail_add: bool = False, lend_views: bool = False, seed: int = 0
    ) -> None:
        super().__init__()
        self.data = data
        self.fail_add = fail_add
        self.lend_views = lend_views
        self.rng = np.random.default_rng(seed)
        self.member = RingMember(self, timeout=5.0)

    @property
    def ring_size(self) -> int:
        return int(self.data.size)

    async def read_chunk(self, lo: int, hi: int) -> np.ndarray:
        return self.data[lo:hi] if self.lend_views else self.data[lo:hi].copy()

    async def _jitter(self) -> None:
        if self.lend_views:
            await asyncio.sleep(float(self.rng.uniform(0.0, 0.002)))

    async def add_chunk(self, lo: int, hi: int, data: np.ndarray) -> None:
        if self.fail_add:
            raise RuntimeError("injected add failure")
        await self._jitter()
        self.data[lo:hi] += data

    async def write_chunk(self, lo: int, hi: int, data: np.ndarray) -> None:
        await self._jitter()
        self.data[lo:hi] = data

    def receive(self, message):
        if RingMember.handles(message):
            return self.member.receive(message, self.context)
        if message == "get":
            return self.data.copy()
        raise TypeError(message)


def test_chunk_bounds_cover_the_buffer() -> None:
    for size in (0, 1, 5, 10, 11):
        for n in (1, 2, 3, 4):
            b = chunk_bounds(size, n)
            assert len(b) == n and b[0][0] == 0 and b[-1][1] == size
            assert all(b[i][1] == b[i + 1][0] for i in range(n - 1))


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("size", [3, 37])
@pytest.mark.parametrize("lend_views", [False, True])
async def test_ring_all_reduce_gives_every_member_the_same_sum(
    actor_system, n: int, size: int, lend_views: bool
) -> None:
    bufs = _buffers(n, size, seed=n)
    expected = np.sum(np.stack(bufs).astype(np.float64), axis=0)
    members = [BufferActor(b.copy(), lend_views=lend_views, seed=k) for k, b in enumerate(bufs)]
    refs = [actor_system.spawn(Props(lambda m=m: m)) for m in members]
    ring = RingAllReduce(timeout=5.0)
    for _ in range(3 if lend_views else 1):  # several interleavings
        for m, b in zip(members, bufs, strict=True):
            m.data[:] = b
        copy = await ring.all_reduce(refs, result_from=n - 1)
        results = [await r.ask("get") for r in refs]
        for res in results:
            np.testing.assert_array_equal(res, results[0])  # bit-identical everywhere
        np.testing.assert_allclose(results[0], expected, rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(copy, results[0])
        # the asker's copy is its own, even when the member lent a view
        assert not any(np.shares_memory(copy, m.data) for m in members)
    await ring.barrier(refs)


async def test_ring_broadcast(actor_system) -> None:
    bufs = _buffers(4, 23)
    refs = [actor_system.spawn(Props(BufferActor, b.copy())) for b in bufs]
    await RingAllReduce(timeout=5.0).broadcast(refs, root=1)
    for r in refs:
        np.testing.assert_array_equal(await r.ask("get"), bufs[1])
    with pytest.raises(IndexError):
        await RingAllReduce().broadcast(refs, root=4)


async def test_ring_failure_is_reported_without_hanging(actor_system) -> None:
    bufs = _buffers(3, 30)
    refs = [
        actor_system.spawn(Props(BufferActor, b.copy(), fail_add=(k == 1)))
        for k, b in enumerate(bufs)
    ]
    with pytest.raises(RuntimeError, match="injected add failure") as info:
        await asyncio.wait_for(RingAllReduce(timeout=5.0).all_reduce(refs), 10)
    assert info.value.failed_workers == [1]
    # the members keep working: a later ring among the healthy ones succeeds
    ok = [refs[0], refs[2]]
    await RingAllReduce(timeout=5.0).all_reduce(ok)


async def test_ring_rejects_non_refs() -> None:
    with pytest.raises(TypeError, match="ActorRef"):
        await RingAllReduce().all_reduce([np.zeros(3)])
    with pytest.raises(ValueError, match="at least one"):
        await RingAllReduce().all_reduce([])
    with pytest.raises(ValueError):
        RingAllReduce(timeout=0)
