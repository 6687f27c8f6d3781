"""Splitting `n` items into contiguous parts: the one rule every trainer uses.

`n` items go into `parts` contiguous chunks, in order, whose sizes differ by
at most one, the longer ones first: the first `n % parts` chunks hold
`n // parts + 1` items, the others `n // parts` (NumPy's `array_split`).
A batch across replicas or workers, a width across tensor-parallel shards,
a parameter vector across servers, the ring's chunks, every collective's
reduce-scatter / all-gather shards and each rank's share of a global batch
(`shard_for_rank`) are all cut this way, in integer arithmetic (exact for
any `n`).

`split_bound` is one chunk's `(start, stop)` without building the others
(a job of a million processes). `bounds` turns any list of sizes (the speed balancer's, the pipeline's
micro-batches) into the same `(start, stop)` form.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

from atomr._arguments import int_at_least, out_of_memory

__all__ = ["bounds", "split_bound", "split_bounds", "split_sizes"]


def split_sizes(n: int, parts: int) -> list[int]:
    """The sizes of `n` items split into `parts` near-equal contiguous chunks.

    Args:
        n: items to split (>= 0).
        parts: chunks (>= 1).

    Returns:
        `parts` sizes summing to `n`; the first `n % parts` are one larger.
        With `n < parts` the last `parts - n` chunks are empty.

    Raises:
        TypeError: an argument is not an integer (NumPy integers are
            accepted, bools are not).
        ValueError: `parts < 1` or `n < 0`.
        MemoryError: `parts` sizes do not fit in memory (the message names
            them and their bytes: `atomr._arguments.out_of_memory`).
    """
    for name, value in (("n", n), ("parts", parts)):
        if isinstance(value, bool) or not hasattr(value, "__index__"):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    n, parts = operator.index(n), operator.index(parts)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    size, extra = divmod(n, parts)
    try:  # a Step's path: no call unless it fails (`building` enters two)
        return [size + 1] * extra + [size] * (parts - extra)
    except MemoryError as exc:  # 10**18 parts: a list no memory holds
        raise out_of_memory(f"the sizes of {parts} parts", 8 * parts) from exc


def split_bounds(n: int, parts: int) -> list[tuple[int, int]]:
    """The `(start, stop)` of each chunk of `split_sizes(n, parts)`.

    Args:
        n: items to split (>= 0).
        parts: chunks (>= 1).

    Returns:
        `parts` contiguous ranges tiling `[0, n)` in order.

    Raises:
        TypeError: an argument is not an integer.
        ValueError: `parts < 1` or `n < 0`.
        MemoryError: more parts than memory holds (as `split_sizes`).

    >>> split_bounds(10, 3)
    [(0, 4), (4, 7), (7, 10)]
    """
    return bounds(split_sizes(n, parts))


def split_bound(n: int, parts: int, k: int) -> tuple[int, int]:
    """Chunk `k`'s `(start, stop)`: `split_bounds(n, parts)[k]`, computed
    directly (time and memory do not grow with `parts`).

    Args:
        n: items to split (>= 0).
        parts: chunks (>= 1).
        k: the chunk, in `[0, parts)`.

    Returns:
        The range of chunk `k`: the first `n % parts` chunks hold
        `n // parts + 1` items, the others `n // parts`.

    Raises:
        TypeError: an argument is not an integer (NumPy integers are
            accepted, bools are not).
        ValueError: `n < 0`, `parts < 1`, or `k` outside `[0, parts)`.

    >>> split_bound(10, 3, 1)
    (4, 7)
    """
    n = int_at_least("n", n, 0, high=None)
    parts = int_at_least("parts", parts, 1, high=None)
    k = int_at_least("k", k, 0, high=parts - 1)
    size, extra = divmod(n, parts)
    start = k * size + min(k, extra)
    return start, start + size + (1 if k < extra else 0)


def bounds(sizes: Sequence[int]) -> list[tuple[int, int]]:
    """The `(start, stop)` of consecutive chunks of the given sizes.

    Args:
        sizes: chunk sizes (each >= 0), in order.

    Returns:
        One range per size, the first starting at 0, each starting where
        the previous one stops.

    Raises:
        ValueError: a negative size.
    """
    out: list[tuple[int, int]] = []
    start = 0
    for size in sizes:
        if size < 0:
            raise ValueError(f"chunk sizes must be >= 0, got {list(sizes)}")
        out.append((start, start + size))
        start += size
    return out
