"""`int_at_least`: the one check of a count argument (an int, not a bool,
at least some bound), shared by the runtime's and the trainers' options;
`bool_flag`: the one check of a yes-or-no argument (a bool, not merely
truthy); `real_number`: the one check that a numeric argument is a real
number; `real_as_float`: a real number as a float, for the finiteness
checks of numeric arguments and of the numbers a checkpoint holds;
`sequence_entries`: the one check that an argument is a list of values
(a list, a tuple or a 1-D NumPy array alike), whose entries the caller checks.

The rule they share: a wrong type is a TypeError, a wrong value a
ValueError; NumPy's scalars count as what they are (`np.int64(3)` an int,
`np.float32(0.5)` a real, `np.bool_(True)` a bool), a bool is no number."""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from numbers import Integral, Real
from typing import SupportsFloat

from atomr._repr import bounded_repr

__all__ = ["bool_flag", "int_at_least", "real_as_float", "real_number", "sequence_entries"]


def int_at_least(name: str, value: object, low: int = 1) -> int:
    """`value` as an int, checked to be an integer (NumPy's too; a bool is
    not) of at least `low`.

    Raises:
        TypeError: not an integer (the message names `name`).
        ValueError: below `low`.
    """
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{name} must be an int, got {bounded_repr(value)}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    return int(value)


def real_number(name: str, value: object) -> float:
    """`value` as a float (`real_as_float`), checked to be a real number
    (NumPy's too; a bool is not). Its range is the caller's to check.

    Raises:
        TypeError: not a real number (the message names `name`).
    """
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a real number, got {bounded_repr(value)}")
    return real_as_float(value)


def bool_flag(name: str, value: object) -> bool:
    """`value`, checked to be a bool (numpy's too): a string such as `'no'`,
    a number or None would be taken by its truth, `'no'` as True.

    Raises:
        TypeError: not a bool (the message names `name`).
    """
    if isinstance(value, bool):
        return value
    numpy = sys.modules.get("numpy")  # not imported: `value` is no numpy bool
    if numpy is None or not isinstance(value, numpy.bool_):
        raise TypeError(f"{name} must be True or False, got {bounded_repr(value)}")
    return bool(value)


def real_as_float(value: SupportsFloat) -> float:
    """`value` as a float; one beyond float's range (an int such as 10**400,
    which `float()` refuses with OverflowError) as an infinity of its sign,
    for the caller's finiteness check to refuse with its own error."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf  # type: ignore[operator]


def sequence_entries(name: str, value: object, what: str) -> list[object]:
    """The entries of `value`: a list, a tuple or another sequence (a string
    or a bytes-like object is none), or a 1-D NumPy array, whose entries
    come as NumPy scalars (so the caller's per-entry check takes
    `np.int64(2)` as an int and refuses `np.float64(2.0)` and
    `np.bool_(True)` as it refuses 2.0 and True).

    Args:
        name: the argument's name, for the message.
        value: the argument.
        what: what its entries are, for the message (e.g. "ints").

    Raises:
        TypeError: not such a sequence: a string or bytes-like object
            (bytes, bytearray, memoryview), a mapping, a set, an iterator or
            generator, a scalar, or an array that is not 1-D.
    """
    numpy = sys.modules.get("numpy")  # not imported: `value` is no array
    if numpy is not None and isinstance(value, numpy.ndarray):
        if value.ndim != 1:
            raise TypeError(
                f"{name} must be a list, tuple or 1-D array of {what}, "
                f"got an array of shape {value.shape}"
            )
        return list(value)
    if isinstance(value, str | bytes | bytearray | memoryview) or not isinstance(value, Sequence):
        raise TypeError(
            f"{name} must be a list, tuple or 1-D array of {what}, got {bounded_repr(value)}"
        )
    return list(value)
