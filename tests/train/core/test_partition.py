"""`core.partition`: the one rule for splitting n items into k contiguous parts."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from atomr.train.core.partition import bounds, split_bounds, split_sizes


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
    with pytest.raises(ValueError, match="cannot split"):
        split_sizes(n, parts)
    with pytest.raises(ValueError, match="cannot split"):
        split_bounds(n, parts)


def test_negative_size_is_refused() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        bounds([2, -1])
