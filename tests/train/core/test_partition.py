"""`core.partition`: the one rule for splitting n items into k contiguous parts."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from atomr.train.comm.mpi.job import shard_for_rank
from atomr.train.core.partition import bounds, split_bound, split_bounds, split_sizes


@given(n=st.integers(0, 10_000), parts=st.integers(1, 300))
def test_split_matches_numpy_array_split(n: int, parts: int) -> None:
    """The reference: NumPy's `array_split` of `range(n)` (first `n % parts` longer)."""
    ref = np.array_split(np.arange(n), parts)
    assert split_sizes(n, parts) == [len(c) for c in ref]
    got = split_bounds(n, parts)
    assert [list(range(lo, hi)) for lo, hi in got] == [c.tolist() for c in ref]


@given(n=st.integers(0, 2**70), parts=st.integers(1, 64))
def test_split_tiles_any_n_exactly(n: int, parts: int) -> None:
    """Integer arithmetic: the chunks tile `[0, n)` even past 2**53, where a
    float formula (`round(i * n / k)`, the parameter server's old one) loses
    the last items."""
    got = split_bounds(n, parts)
    assert got[0][0] == 0 and got[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(got, got[1:], strict=False))
    sizes = [hi - lo for lo, hi in got]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_a_float_formula_would_not_tile_a_huge_vector() -> None:
    n = 2**53 + 1
    float_cut = [round(i * n / 2) for i in range(3)]
    assert float_cut[-1] != n  # the bug of the rounding the servers used
    assert split_bounds(n, 2) == [(0, 2**52 + 1), (2**52 + 1, n)]


def test_fewer_items_than_parts_leaves_the_last_parts_empty() -> None:
    assert split_sizes(2, 4) == [1, 1, 0, 0]
    assert split_bounds(0, 2) == [(0, 0), (0, 0)]


@given(sizes=st.lists(st.integers(0, 50), max_size=20))
def test_bounds_of_sizes(sizes: list[int]) -> None:
    cuts = bounds(sizes)
    assert [hi - lo for lo, hi in cuts] == sizes
    assert [lo for lo, _ in cuts] == list(np.cumsum([0, *sizes])[:-1])


@pytest.mark.parametrize(("n", "parts"), [(5, 0), (5, -1), (-1, 2)])
def test_bad_counts_are_refused(n: int, parts: int) -> None:
    with pytest.raises(ValueError, match="must be >= "):
        split_sizes(n, parts)
    with pytest.raises(ValueError, match="must be >= "):
        split_bounds(n, parts)


def test_negative_size_is_refused() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        bounds([2, -1])


@pytest.mark.parametrize("parts", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("n", [0, 1, 2, 5, 10, 11, 101])
def test_pieces_tile_the_range_first_ones_longer(n: int, parts: int) -> None:
    bounds = split_bounds(n, parts)
    assert len(bounds) == parts
    assert bounds[0][0] == 0 and bounds[-1][1] == n
    assert all(bounds[k][1] == bounds[k + 1][0] for k in range(parts - 1))
    sizes = [hi - lo for lo, hi in bounds]
    # the first n % parts pieces hold one item more than the others
    assert sizes == [n // parts + 1] * (n % parts) + [n // parts] * (parts - n % parts)


@pytest.mark.parametrize("world", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("n", [0, 1, 5, 24, 25, 101])
def test_a_ranks_batch_shard_is_its_piece(n: int, world: int) -> None:
    shards = [shard_for_rank(n, r, world) for r in range(world)]
    assert [(s.start, s.stop) for s in shards] == split_bounds(n, world)


def test_numpy_integers_are_accepted() -> None:
    assert split_bounds(np.int64(5), np.int32(2)) == [(0, 3), (3, 5)]


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((-1, 2), ValueError, "n must be >= 0"),
        ((5, 0), ValueError, "parts must be >= 1"),
        ((5.0, 2), TypeError, "n must be an int"),
        ((5, True), TypeError, "parts must be an int"),
    ],
)
def test_bad_arguments_are_refused(args: tuple, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        split_bounds(*args)


def test_more_parts_than_memory_holds_is_a_memory_error_naming_them() -> None:
    """`split_sizes(10, 10**18)` was a bare MemoryError: it names the parts
    and their bytes, as the rule of sizes asks (`_arguments.out_of_memory`).
    Counts from options and flags are refused before they get here."""
    with pytest.raises(MemoryError) as caught:
        split_sizes(10, 10**18)
    assert str(caught.value) == (
        f"out of memory building the sizes of {10**18} parts ({8 * 10**18} bytes needed)"
    )


def test_split_bound_is_the_chunk_of_split_bounds_for_every_small_case() -> None:
    """Every chunk of every split of up to 40 items into up to 45 parts
    (n = 0, n < parts, n == parts, n % parts == 0, the first and last k)."""
    for n in range(41):
        for parts in range(1, 46):
            assert [split_bound(n, parts, k) for k in range(parts)] == split_bounds(n, parts)


@given(n=st.integers(0, 2**70), parts=st.integers(1, 300), data=st.data())
def test_split_bound_is_the_chunk_of_split_bounds(n: int, parts: int, data) -> None:
    k = data.draw(st.integers(0, parts - 1))
    assert split_bound(n, parts, k) == split_bounds(n, parts)[k]


def test_split_bound_needs_no_list_of_the_parts() -> None:
    """A job of 10**18 parts: `split_bounds` cannot be built, one chunk can."""
    parts = 10**18
    assert split_bound(10, parts, 0) == (0, 1)
    assert split_bound(10, parts, 9) == (9, 10)
    assert split_bound(10, parts, 10) == (10, 10)
    assert split_bound(10, parts, parts - 1) == (10, 10)
    assert split_bound(3 * parts + 2, parts, parts - 1) == (3 * parts + 2 - 3, 3 * parts + 2)
    assert split_bound(np.int64(5), np.int32(2), np.int8(1)) == (3, 5)


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((-1, 2, 0), ValueError, "n must be >= 0"),
        ((5, 0, 0), ValueError, "parts must be >= 1"),
        ((5, 2, 2), ValueError, "k must be <= 1, got 2"),
        ((5, 2, -1), ValueError, "k must be >= 0, got -1"),
        ((5.0, 2, 0), TypeError, "n must be an int"),
        ((5, True, 0), TypeError, "parts must be an int"),
        ((5, 2, False), TypeError, "k must be an int"),
    ],
)
def test_split_bound_refuses_bad_arguments(args: tuple, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        split_bound(*args)
