"""The checks every collective makes of a call: its buffers, their dtype (the
one rule of `check_dtype`), and a broadcast's root."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["COPIED_KINDS", "SUMMED_DTYPES", "check_buffers", "check_dtype", "check_root"]

SUMMED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
"""The dtypes every collective sums (`all_reduce`, `reduce_scatter`): what
the host's kernels and MPI's reductions take, and what a ring refuses
otherwise, so that one input gets one answer from every collective."""

COPIED_KINDS = "biufc"
"""The NumPy dtype kinds every collective copies (`all_gather`, `broadcast`):
bool, signed and unsigned integers, floats and complex numbers, in the
machine's byte order: what MPI can move (an object, string, datetime or
structured dtype, or a non-native byte order, it cannot)."""


def check_dtype(dtype: np.dtype[Any], *, sums: bool) -> None:
    """The one dtype rule of every collective's operations.

    Args:
        dtype: the dtype of the call's buffers.
        sums: the operation sums them (`all_reduce`, `reduce_scatter`); else
            it copies them (`all_gather`, `broadcast`).

    Raises:
        TypeError: a dtype the operation does not take (`SUMMED_DTYPES` for
            a sum, `COPIED_KINDS` in native byte order for a copy).
    """
    if sums:
        if dtype not in SUMMED_DTYPES:
            raise TypeError(f"buffers have dtype {dtype}; a collective sums float32 or float64")
    elif dtype.kind not in COPIED_KINDS or not dtype.isnative:
        raise TypeError(
            f"buffers have dtype {dtype}; a collective copies bool, integer, float or "
            "complex dtypes in native byte order"
        )


def check_buffers(
    buffers: Sequence[Any],
    *,
    sums: bool,
    flat: bool = False,
    writable: bool = False,
) -> list[np.ndarray]:
    """The buffers of one collective call, checked: a non-empty list of numpy
    arrays of one shape and of one dtype the operation takes (`check_dtype`).

    The same rules at every group size: a group of one is refused what a
    group of two is refused, though it has nothing to add up.

    Args:
        buffers: the caller's buffers.
        sums: the operation sums them (else it copies them: `check_dtype`).
        flat: they must be 1-D.
        writable: they must all be writable.

    Returns:
        The buffers, as a list.

    Raises:
        TypeError: not a list, an item that is not a numpy array or is a
            masked one or a matrix, or a dtype the operation does not take.
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
        if isinstance(b, np.ma.MaskedArray):  # `validation.refuse_masked`'s reason
            raise TypeError(
                f"buffers[{k}] is a masked array; a collective works on the raw memory, "
                "hidden values included: pass a plain array"
            )
        if isinstance(b, np.matrix):  # it stays 2-D however it is flattened
            raise TypeError(f"buffers[{k}] is a numpy matrix: pass a plain array (np.asarray)")
        if b.shape != buffers[0].shape or b.dtype != buffers[0].dtype:
            raise ValueError(
                f"buffers[{k}] is {b.dtype}{b.shape}, buffers[0] is "
                f"{buffers[0].dtype}{buffers[0].shape}; all must match"
            )
        if writable and not b.flags.writeable:
            raise ValueError(f"buffers[{k}] must be writable (the result is written in place)")
        out.append(b)
    check_dtype(out[0].dtype, sums=sums)
    if flat and out[0].ndim != 1:
        raise ValueError(f"buffers must be flat (1-D), got shape {out[0].shape}")
    return out


def check_root(root: Any, n: int, name: str = "root") -> int:
    """A broadcast's root (or another participant's index, `name`),
    checked: an integer (NumPy integers too, not bools) naming one of the
    `n` participants.

    Returns:
        The root, as an int.

    Raises:
        TypeError: not an integer.
        IndexError: not in `[0, n)`.
    """
    if isinstance(root, bool) or not hasattr(root, "__index__"):
        raise TypeError(f"{name} must be an int, got {type(root).__name__}")
    index = operator.index(root)
    if not 0 <= index < n:
        raise IndexError(f"{name} {index} out of range for a group of {n}")
    return index
