"""This process's buffers for an `MpiCollective` call: the checks, and the
local numpy work before and after the MPI call (summing several local
contributions, dividing for a mean, moving a reduce-scatter's chunk,
copying a result into the other local buffers)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np

from atomr.train.comm._checks import SUMMED_DTYPES
from atomr.train.comm._checks import check_buffers as check_group

__all__ = [
    "INLINE_BYTES",
    "OPS",
    "check_buffers",
    "check_writable",
    "copy_into",
    "distribution_work",
    "divide",
    "move",
    "reduction_work",
    "sum_into",
]

OPS = ("sum", "mean")
"""The reductions: the sum, or the sum divided by the number of contributions."""
INLINE_BYTES = 1 << 20
"""Local numpy work on fewer bytes runs on the event loop; on more, on the
MPI thread."""


def check_buffers(
    buffers: Sequence[Any] | np.ndarray, *, sums: bool, flat: bool = False
) -> list[np.ndarray]:
    """Validate this process's buffers (`comm._checks.check_buffers`, and
    what MPI needs of them); returns them as a list.

    Args:
        buffers: an array, or a list of arrays of one shape and dtype.
        sums: the operation sums them (else it copies them: the dtypes
            taken are `comm._checks.check_dtype`'s).
        flat: the buffers must be 1-D.

    Raises:
        TypeError: not numpy arrays (or masked ones), or a dtype the
            operation does not take (a sum: float32 or float64; a copy:
            bool, integer, float or complex in native byte order).
        ValueError: no buffers, mixed shapes / dtypes, not flat (with
            `flat`), `buffers[0]` non-contiguous or read-only, or another
            buffer that overlaps `buffers[0]` (the local buffers are summed
            into it, or receive it: one that overlaps it would be read after,
            or written over, the result).
    """
    if type(buffers) is np.ndarray and buffers.dtype in SUMMED_DTYPES and buffers.flags.carray:
        bufs = [buffers]  # the common case (every operation takes it), checked in one go
    else:
        if isinstance(buffers, str | bytes) or not isinstance(buffers, Sequence | np.ndarray):
            raise TypeError(
                f"buffers must be an array or a list of arrays, got {type(buffers).__name__}"
            )
        bufs = check_group([buffers] if isinstance(buffers, np.ndarray) else buffers, sums=sums)
        if not bufs[0].flags.c_contiguous:
            raise ValueError("buffers[0] must be C-contiguous (MPI works on the raw memory)")
        if not bufs[0].flags.writeable:
            raise ValueError("buffers[0] must be writable (the result is written in place)")
        for k in range(1, len(bufs)):
            if np.may_share_memory(bufs[0], bufs[k]) and np.shares_memory(bufs[0], bufs[k]):
                raise ValueError(
                    f"buffers[{k}] overlaps buffers[0], which holds the result: "
                    "pass each local buffer once, in memory of its own"
                )
    if flat and bufs[0].ndim != 1:
        raise ValueError(f"buffers must be flat (1-D), got shape {bufs[0].shape}")
    return bufs


def check_writable(bufs: Sequence[np.ndarray], what: str) -> None:
    """Refuse a read-only local buffer up front (`buffers[0]` is checked by
    `check_buffers`).

    Raises:
        ValueError: naming the buffer, and `what` writes every buffer.
    """
    for k in range(1, len(bufs)):
        if not bufs[k].flags.writeable:
            raise ValueError(f"buffers[{k}] must be writable ({what} writes every buffer)")


def sum_into(target: np.ndarray, others: Sequence[np.ndarray]) -> None:
    """`target += other`, for each of `others` in order."""
    for other in others:
        np.add(target, other, out=target)


def divide(target: np.ndarray, count: int) -> None:
    """`target /= count`, in `target`'s dtype."""
    np.divide(target, target.dtype.type(count), out=target)


def copy_into(targets: Sequence[np.ndarray], source: np.ndarray) -> None:
    """Copy `source` into each of `targets`."""
    for target in targets:
        np.copyto(target, source)


def move(buffer: np.ndarray, lo: int, hi: int) -> None:
    """`buffer[lo:hi] = buffer[:hi - lo]` (the regions may overlap): where an
    in-place `Reduce_scatter` leaves this rank's chunk, to where it belongs."""
    if lo:
        np.copyto(buffer[lo:hi], buffer[: hi - lo])


def reduction_work(
    bufs: list[np.ndarray], op: str, world_size: int, chunk: tuple[int, int] | None = None
) -> tuple[Callable[[], None] | None, Callable[[], None] | None, bool]:
    """The local work of a reduction, as `OperationDriver.submit`'s `before`,
    `after` and `offload`: before, sum the local buffers into `bufs[0]`;
    after, move the result to `chunk` (an in-place reduce-scatter leaves it
    at the front) and divide it by the number of contributions for a mean.

    Raises:
        ValueError: `op` is not "sum" or "mean".
    """
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    target = bufs[0]
    if len(bufs) == 1 and op == "sum" and not (chunk and chunk[0]):
        return None, None, False  # the common case: nothing to do locally
    before = partial(sum_into, target, bufs[1:]) if len(bufs) > 1 else None
    after: Callable[[], None] | None = None
    if chunk is not None and chunk[0] > 0:
        after = partial(move, target, *chunk)
    if op == "mean":
        result = target if chunk is None else target[chunk[0] : chunk[1]]
        mean = partial(divide, result, world_size * len(bufs))
        after = mean if after is None else _in_turn(after, mean)
    return before, after, target.nbytes * len(bufs) >= INLINE_BYTES


def distribution_work(
    bufs: list[np.ndarray],
) -> tuple[None, Callable[[], None] | None, bool]:
    """The local work of a gather or broadcast, as `OperationDriver.submit`'s
    `before`, `after` and `offload`: after, copy `bufs[0]` into the other
    local buffers."""
    if len(bufs) == 1:
        return None, None, False
    return None, partial(copy_into, bufs[1:], bufs[0]), bufs[0].nbytes * len(bufs) >= INLINE_BYTES


def _in_turn(*steps: Callable[[], None]) -> Callable[[], None]:
    """One callable running `steps` in order."""

    def run() -> None:
        for step in steps:
            step()

    return run
