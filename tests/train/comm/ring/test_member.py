"""`RingMember`: members that lend views of their buffers stay correct under
any interleaving of their steps, and the asker's copy is its own."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from atomr import ActorRef, ActorSystem, Props
from atomr.actor import actor_failed
from atomr.train.comm.ring import RingCollective, RingMember
from atomr.train.comm.ring.messages import RingAbort, RingReduce
from atomr.train.core.partition import split_bounds
from tests.train.comm.conftest import BufferActor


def _buffers(n: int, size: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(size).astype(np.float32) for _ in range(n)]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("size", [3, 37])
@pytest.mark.parametrize("lend_views", [False, True])
async def test_all_reduce_gives_every_member_the_same_sum(
    spawn_ring: Callable[..., list[ActorRef]], n: int, size: int, lend_views: bool
) -> None:
    bufs = _buffers(n, size, seed=n)
    expected = np.sum(np.stack(bufs).astype(np.float64), axis=0)
    ring = RingCollective(timeout=5.0)
    for attempt in range(3 if lend_views else 1):  # several interleavings
        refs = spawn_ring(bufs, lend_views=lend_views)
        copy = await ring.all_reduce(refs, result_from=n - 1)
        results = [await r.ask("get") for r in refs]
        for res in results:
            np.testing.assert_array_equal(res, results[0])  # bit-identical everywhere
        np.testing.assert_allclose(results[0], expected, rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(copy, results[0])
        # the asker's copy is its own, even when the member lent a view
        copy[:] = attempt + 1000.0
        np.testing.assert_array_equal(await refs[-1].ask("get"), results[-1])
    await ring.barrier(refs)


@pytest.mark.parametrize("n", [2, 3, 5])
async def test_phases_alone_with_views_lent_in_any_order(
    spawn_ring: Callable[..., list[ActorRef]], n: int
) -> None:
    bufs = _buffers(n, 23, seed=7)
    expected = np.sum(np.stack(bufs).astype(np.float64), axis=0)
    bounds = split_bounds(23, n)
    ring = RingCollective(timeout=5.0)
    for _ in range(3):
        refs = spawn_ring(bufs, lend_views=True)
        chunk = await ring.reduce_scatter(refs, result_from=n - 1)
        lo, hi = bounds[n - 1]
        np.testing.assert_allclose(chunk, expected[lo:hi], rtol=1e-6, atol=1e-6)
        gathered = await ring.all_gather(refs, result_from=0)
        results = [await r.ask("get") for r in refs]
        for res in results:
            np.testing.assert_array_equal(res, gathered)
        np.testing.assert_array_equal(gathered[lo:hi], chunk)


async def test_result_from_must_name_a_member(
    spawn_ring: Callable[..., list[ActorRef]],
) -> None:
    refs = spawn_ring(_buffers(2, 5))
    for operation in (
        RingCollective().all_reduce,
        RingCollective().reduce_scatter,
        RingCollective().all_gather,
    ):
        with pytest.raises(IndexError, match="result_from"):
            await operation(refs, result_from=2)
        # the index rule of a broadcast's root: True was member 1, 0.0 member 0
        for bad in (True, 0.0, "0"):
            with pytest.raises(
                TypeError, match=f"^result_from must be an int, got {type(bad).__name__}$"
            ):
                await operation(refs, result_from=bad)  # type: ignore[arg-type]


def test_member_handles_only_ring_messages() -> None:
    assert not RingMember.handles("get")
    assert not RingMember.handles(np.zeros(3))


async def test_a_member_that_fails_on_its_own_buffer_work_answers_actor_failed(
    spawn_ring: Callable[..., list[ActorRef]],
) -> None:
    """Member 1's `add_chunk` raises: the member fails (its supervisor
    restarts it, its state lost), so its asker's error is marked
    `actor_failed` as soon as the ask raises, as every error that escaped an
    actor is. It was answered unmarked, as if the member kept its state."""
    refs = spawn_ring(_buffers(2, 4), faults={1: "fail_add"})
    peers = tuple(refs)
    refs[0].tell(RingReduce(7, peers, 0))
    try:
        await refs[1].ask(RingReduce(7, peers, 1), timeout=5.0)
    except RuntimeError as exc:
        error, marked = exc, actor_failed(exc)  # read as soon as the ask raised
    else:
        pytest.fail("the failing member answered")
    refs[0].tell(RingAbort(7))
    assert str(error) == "injected add failure"
    assert marked


class _DtypeReads(BufferActor):
    """A member counting the reads that only learn its buffer's dtype
    (zero-length chunks)."""

    def __init__(self, data: np.ndarray) -> None:
        super().__init__(data)
        self.dtype_reads = 0

    async def read_chunk(self, lo: int, hi: int) -> np.ndarray:
        self.dtype_reads += lo == hi
        return await super().read_chunk(lo, hi)

    def receive(self, message):  # type: ignore[no-untyped-def]
        if message == "dtype_reads":
            return self.dtype_reads
        return super().receive(message)


@pytest.mark.parametrize("root", [0, 2])
async def test_a_broadcast_reads_each_members_dtype_once(
    actor_system: ActorSystem, root: int
) -> None:
    """A non-root member of a broadcast read its buffer's dtype twice: once
    for the dtype rule (`check_dtype`), once more for the chunks it accepts.
    It is read once per operation, and that one dtype serves both."""
    bufs = _buffers(3, 11, seed=4)
    refs = [actor_system.spawn(Props(_DtypeReads, b.copy())) for b in bufs]
    await RingCollective(timeout=5.0).broadcast(refs, root)
    for ref in refs:
        np.testing.assert_array_equal(await ref.ask("get"), bufs[root])
        assert await ref.ask("dtype_reads") == 1
