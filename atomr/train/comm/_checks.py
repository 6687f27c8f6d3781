"""The checks every collective makes of a call: its buffers (their dtype
too), and a broadcast's root."""

from __future__ import annotations

import operator
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np

__all__ = ["check_buffers", "check_root"]


def check_buffers(
    buffers: Sequence[Any],
    *,
    flat: bool = False,
    writable: bool = False,
    dtypes: Collection[np.dtype[Any]] = (),
) -> list[np.ndarray]:
    """The buffers of one collective call, checked: a non-empty list of numpy
    arrays of one shape and dtype.

    The same rules at every group size: a group of one is refused what a
    group of two is refused, though it has nothing to add up.

    Args:
        buffers: the caller's buffers.
        flat: they must be 1-D.
        writable: they must all be writable.
        dtypes: the dtypes the call computes in (empty: any).

    Returns:
        The buffers, as a list.

    Raises:
        TypeError: not a list, an item that is not a numpy array, or a dtype
            not in `dtypes`.
        ValueError: no buffers, shapes / dtypes that differ, not 1-D (with
            `flat`), or a read-only buffer (with `writable`).
    """
    if isinstance(buffers, np.ndarray) or not isinstance(buffers, Sequence):
        raise TypeError(f"buffers must be a list of arrays, got {type(buffers).__name__}")
    if len(buffers) == 0:
        raise ValueError("a collective needs at least one buffer")
    out = []
    for k, b in enumerate(buffers):
        if not isinstance(b, np.ndarray):
            raise TypeError(f"buffers[{k}] must be a numpy array, got {type(b).__name__}")
        if b.shape != buffers[0].shape or b.dtype != buffers[0].dtype:
            raise ValueError(
                f"buffers[{k}] is {b.dtype}{b.shape}, buffers[0] is "
                f"{buffers[0].dtype}{buffers[0].shape}; all must match"
            )
        if writable and not b.flags.writeable:
            raise ValueError(f"buffers[{k}] must be writable (the result is written in place)")
        out.append(b)
    if dtypes and out[0].dtype not in dtypes:
        accepted = " or ".join(str(d) for d in dtypes)
        raise TypeError(f"buffers have dtype {out[0].dtype}; the collective takes {accepted}")
    if flat and out[0].ndim != 1:
        raise ValueError(f"buffers must be flat (1-D), got shape {out[0].shape}")
    return out


def check_root(root: Any, n: int) -> int:
    """A broadcast's root, checked: an integer (NumPy integers too, not bools)
    naming one of the `n` participants.

    Returns:
        The root, as an int.

    Raises:
        TypeError: not an integer.
        IndexError: not in `[0, n)`.
    """
    if isinstance(root, bool) or not hasattr(root, "__index__"):
        raise TypeError(f"root must be an int, got {type(root).__name__}")
    index = operator.index(root)
    if not 0 <= index < n:
        raise IndexError(f"root {index} out of range for a group of {n}")
    return index
