"""Splitting `n` items into contiguous parts: the one rule every trainer uses.

`n` items go into `parts` contiguous chunks, in order, whose sizes differ by
at most one, the longer ones first: the first `n % parts` chunks hold
`n // parts + 1` items, the others `n // parts` (NumPy's `array_split`).
A batch across replicas or workers, a width across tensor-parallel shards
and a parameter vector across servers are all cut this way, in integer
arithmetic (exact for any `n`).

`bounds` turns any list of sizes (the speed balancer's, the pipeline's
micro-batches) into the same `(start, stop)` form.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["bounds", "split_bounds", "split_sizes"]


def split_sizes(n: int, parts: int) -> list[int]:
    """The sizes of `n` items split into `parts` near-equal contiguous chunks.

    Args:
        n: items to split (>= 0).
        parts: chunks (>= 1).

    Returns:
        `parts` sizes summing to `n`; the first `n % parts` are one larger.
        With `n < parts` the last `parts - n` chunks are empty.

    Raises:
        ValueError: `parts < 1` or `n < 0`.
    """
    if parts < 1 or n < 0:
        raise ValueError(f"cannot split {n} items into {parts} parts (need n >= 0, parts >= 1)")
    size, extra = divmod(n, parts)
    return [size + 1 if i < extra else size for i in range(parts)]


def split_bounds(n: int, parts: int) -> list[tuple[int, int]]:
    """The `(start, stop)` of each chunk of `split_sizes(n, parts)`.

    Args:
        n: items to split (>= 0).
        parts: chunks (>= 1).

    Returns:
        `parts` contiguous ranges tiling `[0, n)` in order.

    Raises:
        ValueError: `parts < 1` or `n < 0`.
    """
    return bounds(split_sizes(n, parts))


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
