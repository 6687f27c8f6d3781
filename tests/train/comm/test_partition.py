"""`split_bounds`: the one partition rule of the collectives."""

from __future__ import annotations

import numpy as np
import pytest

from atomr.train.comm.mpi.job import shard_for_rank
from atomr.train.comm.partition import split_bounds


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
