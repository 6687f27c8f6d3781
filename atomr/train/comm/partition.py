"""The one rule for cutting `n` items into `parts` contiguous pieces.

The pieces are taken in order, and their sizes differ by at most one: the
first `n % parts` pieces hold `n // parts + 1` items, the others
`n // parts`. With fewer items than pieces the last pieces are empty.

Every split in the collectives follows it: the ring's chunks, the
reduce-scatter / all-gather shards of every `Collective`, and each rank's
share of a global batch (`shard_for_rank`).
"""

from __future__ import annotations

import operator

__all__ = ["split_bounds"]


def split_bounds(n: int, parts: int) -> list[tuple[int, int]]:
    """The `(lo, hi)` bounds of `parts` contiguous pieces of `range(n)`.

    Piece `k` is `range(lo_k, hi_k)`; the pieces tile `range(n)` in order,
    and the first `n % parts` are one item longer than the others.

    Args:
        n: items to split (>= 0).
        parts: pieces (>= 1).

    Returns:
        `parts` pairs, `hi_k == lo_{k+1}`, starting at 0 and ending at `n`.

    Raises:
        TypeError: an argument is not an integer (numpy integers are
            accepted, bools are not).
        ValueError: `n < 0` or `parts < 1`.

    >>> split_bounds(10, 3)
    [(0, 4), (4, 7), (7, 10)]
    """
    for name, value in (("n", n), ("parts", parts)):
        if isinstance(value, bool) or not hasattr(value, "__index__"):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    n, parts = operator.index(n), operator.index(parts)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    base, extra = divmod(n, parts)
    bounds, lo = [], 0
    for k in range(parts):
        hi = lo + base + (1 if k < extra else 0)
        bounds.append((lo, hi))
        lo = hi
    return bounds
