"""The five operations of `Collective`, held to one contract by every
in-process collective (`HostCollective` over arrays, `RingCollective` over
actors): each against a float64 NumPy reference, with group sizes that do
not divide the buffer (and buffers shorter than the group), a group of one,
and the same bits on every participant. `MpiCollective` is held to the same
contract across processes in `mpi/test_collective.py`."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pytest

from atomr import ActorRef
from atomr.train.comm.collective import Collective, HostCollective
from atomr.train.comm.ring import RingCollective
from atomr.train.core.partition import split_bounds

SpawnRing = Callable[..., list[ActorRef]]  # the `spawn_ring` fixture (conftest.py)

GROUPS = [1, 2, 3, 4]
SIZES = [1, 7, 37]  # 1: some chunks are empty; 7 and 37: no group size divides them


class Group:
    """A collective and its participants, participant k starting with a copy
    of `arrays[k]`."""

    def __init__(self, kind: str, arrays: Sequence[np.ndarray], spawn_ring: SpawnRing) -> None:
        self.kind = kind
        self.collective: Collective
        if kind == "host":
            self.collective = HostCollective()
            self._arrays = [a.copy() for a in arrays]
            self.participants: list[Any] = list(self._arrays)
        else:
            self.collective = RingCollective(timeout=5.0)
            self._refs: list[ActorRef] = spawn_ring(arrays)
            self.participants = list(self._refs)

    async def buffers(self) -> list[np.ndarray]:
        """A copy of every participant's buffer, now."""
        if self.kind == "host":
            return [a.copy() for a in self._arrays]
        return [await ref.ask("get") for ref in self._refs]

    async def sums(self, result: Any) -> list[np.ndarray]:
        """What each participant reads after `all_reduce` returned `result`:
        the host collective's output, each ring member's own buffer."""
        if self.kind == "host":
            return [result.copy() for _ in self.participants]
        assert result is None
        return await self.buffers()

    def close(self) -> None:
        if isinstance(self.collective, HostCollective):
            self.collective.close()


@pytest.fixture(params=["host", "ring"])
def make_group(
    request: pytest.FixtureRequest, spawn_ring: SpawnRing
) -> Iterator[Callable[[Sequence[np.ndarray]], Group]]:
    groups: list[Group] = []

    def make(arrays: Sequence[np.ndarray]) -> Group:
        groups.append(Group(request.param, arrays, spawn_ring))
        return groups[-1]

    yield make
    for group in groups:
        group.close()


def contributions(n: int, size: int, dtype: type = np.float32, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed + 100 * n + size)
    return [rng.standard_normal(size).astype(dtype) for _ in range(n)]


def reference_sum(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """The sum in float64: the reference every collective's sum is held to."""
    return np.sum(np.stack(arrays).astype(np.float64), axis=0)


def assert_close(got: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=1e-5, atol=1e-5)


def assert_same_bits(buffers: Sequence[np.ndarray]) -> None:
    for k, b in enumerate(buffers):
        assert b.tobytes() == buffers[0].tobytes(), f"participant {k} holds other bits"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("n", GROUPS)
async def test_all_reduce_gives_every_participant_the_sum(
    make_group: Callable[..., Group], n: int, size: int, dtype: type
) -> None:
    arrays = contributions(n, size, dtype)
    group = make_group(arrays)
    sums = await group.sums(await group.collective.all_reduce(group.participants))
    for s in sums:
        assert s.dtype == dtype
        assert_close(s, reference_sum(arrays))
    assert_same_bits(sums)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("n", GROUPS)
async def test_reduce_scatter_leaves_chunk_k_of_the_sum_with_participant_k(
    make_group: Callable[..., Group], n: int, size: int, dtype: type
) -> None:
    arrays = contributions(n, size, dtype)
    group = make_group(arrays)
    result = await group.collective.reduce_scatter(group.participants)
    buffers = await group.buffers()
    bounds = split_bounds(size, n)
    for k, (lo, hi) in enumerate(bounds):
        assert_close(buffers[k][lo:hi], reference_sum(arrays)[lo:hi])
    if group.kind == "host":  # the participants' chunks, as views into their buffers
        assert [c.tobytes() for c in result] == [
            b[lo:hi].tobytes() for b, (lo, hi) in zip(buffers, bounds, strict=True)
        ]
        pairs = zip(result, group.participants, strict=True)
        assert all(np.shares_memory(c, p) for c, p in pairs if c.size)
    else:
        assert result is None


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("n", GROUPS)
async def test_all_gather_gives_everyone_chunk_k_of_participant_k(
    make_group: Callable[..., Group], n: int, size: int
) -> None:
    bounds = split_bounds(size, n)
    own = contributions(n, size, np.float64)
    arrays = [np.full(size, np.nan) for _ in range(n)]  # positions never read stay NaN
    expected = np.empty(size)
    for k, (lo, hi) in enumerate(bounds):
        arrays[k][lo:hi] = own[k][lo:hi]
        expected[lo:hi] = own[k][lo:hi]
    group = make_group(arrays)
    await group.collective.all_gather(group.participants)
    for b in await group.buffers():
        assert b.tobytes() == expected.tobytes()


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("n", GROUPS)
async def test_reduce_scatter_then_all_gather_is_the_all_reduce_bit_for_bit(
    make_group: Callable[..., Group], n: int, size: int
) -> None:
    arrays = contributions(n, size, seed=1)
    reduced = make_group(arrays)
    sums = await reduced.sums(await reduced.collective.all_reduce(reduced.participants))
    phased = make_group(arrays)
    await phased.collective.reduce_scatter(phased.participants)
    await phased.collective.all_gather(phased.participants)
    gathered = await phased.buffers()
    assert_same_bits(gathered)
    assert gathered[0].tobytes() == sums[0].tobytes()
    assert_close(gathered[0], reference_sum(arrays))


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("n", GROUPS)
async def test_broadcast_copies_the_roots_bits_from_every_root(
    make_group: Callable[..., Group], n: int, size: int
) -> None:
    for root in range(n):
        arrays = contributions(n, size, seed=root)
        group = make_group(arrays)
        await group.collective.broadcast(group.participants, root=root)
        for b in await group.buffers():
            assert b.tobytes() == arrays[root].tobytes()
        with pytest.raises(IndexError):
            await group.collective.broadcast(group.participants, root=n)


@pytest.mark.parametrize("n", GROUPS)
async def test_barrier_returns_and_leaves_the_buffers_alone(
    make_group: Callable[..., Group], n: int
) -> None:
    arrays = contributions(n, 7)
    group = make_group(arrays)
    await group.collective.barrier(group.participants)
    for b, a in zip(await group.buffers(), arrays, strict=True):
        assert b.tobytes() == a.tobytes()


async def test_broadcast_takes_any_integer_root_and_refuses_the_rest(
    make_group: Callable[..., Group],
) -> None:
    """A NumPy integer root is a root (every collective takes it); a bool or
    a float is refused with TypeError before anything is written (the host
    took `True` for 1; the MPI collective refused `np.int64(0)`)."""
    arrays = contributions(3, 7)
    group = make_group(arrays)
    for root in (True, 1.0, "1"):
        with pytest.raises(TypeError, match="root must be an int"):
            await group.collective.broadcast(group.participants, root=root)  # type: ignore[arg-type]
    for b, a in zip(await group.buffers(), arrays, strict=True):
        assert b.tobytes() == a.tobytes()
    with pytest.raises(IndexError, match="out of range"):
        await group.collective.broadcast(group.participants, root=np.int64(-1))
    await group.collective.broadcast(group.participants, root=np.int64(2))
    for b in await group.buffers():
        assert b.tobytes() == arrays[2].tobytes()


async def test_host_broadcast_refuses_a_read_only_buffer_before_writing_any() -> None:
    """A read-only buffer among the others: refused with every buffer as it
    was (the ones before it were written first)."""
    root, a, b = np.ones(3), np.zeros(3), np.zeros(3)
    read_only = np.zeros(3)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match=r"buffers\[2\] must be writable"):
        await HostCollective().broadcast([root, a, read_only, b])
    np.testing.assert_array_equal(a, np.zeros(3))
    np.testing.assert_array_equal(b, np.zeros(3))


COPIED = [np.bool_, np.int8, np.int64, np.uint16, np.float16, np.float32, np.complex128]
"""Dtypes every collective copies (`all_gather`, `broadcast`): what MPI moves."""
NOT_COPIED = ["O", "U2", "datetime64[s]", ">f4", "f4,i4"]
"""Dtypes no collective takes: MPI cannot move them (an object, a string, a
datetime, a non-native byte order, a structured dtype)."""
NOT_SUMMED = [np.bool_, np.int32, np.int64, np.float16, np.complex64]
"""Copied but not summed: the host's kernels and MPI's reductions sum float32
and float64 only."""


def _distinct(n: int, size: int, dtype: Any) -> list[np.ndarray]:
    """Participant k's buffer: values that differ from every other one's."""
    return [(np.arange(size) * n + k).astype(dtype) for k in range(n)]


@pytest.mark.parametrize("dtype", COPIED)
async def test_the_copies_move_every_numeric_dtype_bit_for_bit(
    make_group: Callable[..., Group], dtype: Any
) -> None:
    n, size = 3, 7
    arrays = _distinct(n, size, dtype)
    group = make_group(arrays)
    await group.collective.broadcast(group.participants, root=1)
    for b in await group.buffers():
        assert b.dtype == np.dtype(dtype) and b.tobytes() == arrays[1].tobytes()
    group = make_group(arrays)
    await group.collective.all_gather(group.participants)
    expected = np.empty(size, dtype)
    for k, (lo, hi) in enumerate(split_bounds(size, n)):
        expected[lo:hi] = arrays[k][lo:hi]
    for b in await group.buffers():
        assert b.tobytes() == expected.tobytes()


async def _refused(group: Group, operation: str, arrays: Sequence[np.ndarray], match: str) -> None:
    """`operation` raises TypeError (`match`), every buffer is as it was, and
    the participants still answer."""
    with pytest.raises(TypeError, match=match):
        await getattr(group.collective, operation)(group.participants)
    for b, a in zip(await group.buffers(), arrays, strict=True):
        assert b.dtype == a.dtype and b.tobytes() == a.tobytes()
    await group.collective.barrier(group.participants)


@pytest.mark.parametrize("dtype", NOT_COPIED)
@pytest.mark.parametrize("operation", ["all_gather", "broadcast"])
async def test_the_copies_refuse_what_mpi_cannot_move(
    make_group: Callable[..., Group], operation: str, dtype: str
) -> None:
    """The same answer as the MPI collective's: a TypeError, nothing written
    (the host and the ring used to copy them)."""
    arrays = [np.zeros(5, dtype) for _ in range(2)]
    await _refused(make_group(arrays), operation, arrays, "a collective copies bool, integer")


@pytest.mark.parametrize("dtype", NOT_SUMMED)
@pytest.mark.parametrize("operation", ["all_reduce", "reduce_scatter"])
async def test_the_sums_refuse_every_dtype_but_float32_and_float64(
    make_group: Callable[..., Group], operation: str, dtype: Any
) -> None:
    """The same answer as the host's and the MPI collective's: a TypeError,
    nothing written (the ring used to sum integers, and float16)."""
    arrays = _distinct(2, 5, dtype)
    await _refused(make_group(arrays), operation, arrays, "a collective sums float32 or float64")
