"""`int_at_least`: the one check of a count argument (an int, not a bool,
at least some bound), shared by the runtime's and the trainers' options;
`bool_flag`: the one check of a yes-or-no argument (a bool, not merely
truthy); `real_number`: the one check that a numeric argument is a real
number; `real_as_float`: a real number as a float, for the finiteness
checks of numeric arguments and of the numbers a checkpoint holds;
`sequence_entries`: the one check that an argument is a list of values
(a list, a tuple or a 1-D NumPy array alike), whose entries the caller checks;
`array_bytes` and `building`: the one rule of sizes, below.

The rule they share: a wrong type is a TypeError, a wrong value a
ValueError; NumPy's scalars count as what they are (`np.int64(3)` an int,
`np.float32(0.5)` a real, `np.bool_(True)` a bool), a bool is no number.

The rule of sizes: a size or count that no array could hold, one beyond
`INDEX_MAX` (what NumPy's index type `np.intp` holds) or an array whose
bytes would be, is refused with a ValueError that names it, its value and
the limit, before anything is allocated or changed (`int_at_least`,
`array_bytes`). A size that is merely large is tried; a MemoryError while
allocating it is raised again naming what was being built and its bytes
(`building`, or `out_of_memory` where no function may be entered before)."""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from numbers import Integral, Real
from typing import SupportsFloat

from atomr._repr import bounded_repr

__all__ = [
    "INDEX_MAX",
    "array_bytes",
    "bool_flag",
    "building",
    "int_at_least",
    "out_of_memory",
    "real_as_float",
    "real_number",
    "sequence_entries",
]

INDEX_MAX = sys.maxsize
"""The largest size or count atomr takes: what NumPy's index type `np.intp`
(C's `ssize_t`) holds, 2**63 - 1 on a 64-bit machine."""

_ENTRY_BYTES = 8 + sys.getsizeof(0)
"""What one entry of a listed sequence takes at least: its pointer and an
int object (a `range`'s entries are made as they are listed)."""


def int_at_least(name: str, value: object, low: int = 1, *, high: int | None = INDEX_MAX) -> int:
    """`value` as an int, checked to be an integer (NumPy's too; a bool is
    not) of at least `low` and at most `high` (by default `INDEX_MAX`: a
    count no array could index is refused; None for a number that counts
    nothing an array holds: a seed, a schedule's period).

    Raises:
        TypeError: not an integer (the message names `name`).
        ValueError: below `low`, or above `high` (the message names the limit).
    """
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{name} must be an int, got {bounded_repr(value)}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {bounded_repr(value)}")
    number = int(value)
    if high is not None and number > high:
        raise ValueError(f"{name} must be <= {high}, got {bounded_repr(number)}")
    return number


def array_bytes(what: str, count: int, itemsize: int) -> int:
    """The bytes of an array of `count` items of `itemsize` bytes, checked
    to be ones an array can hold (at most `INDEX_MAX`): call it before
    allocating.

    Raises:
        ValueError: more (the message names `what`, the count, the bytes
            and the limit).
    """
    nbytes = count * itemsize
    if nbytes > INDEX_MAX:
        raise ValueError(
            f"{what}: {bounded_repr(count)} items of {itemsize} bytes need "
            f"{bounded_repr(nbytes)} bytes, more than the {INDEX_MAX} an array can hold"
        )
    return nbytes


@contextmanager
def building(what: str, nbytes: int) -> Iterator[None]:
    """Run the allocation of `what`, `nbytes` bytes (`array_bytes`): a
    MemoryError in it is raised again naming both (the original chained).

    Raises:
        MemoryError: the allocation failed.
    """
    try:
        yield
    except MemoryError as exc:
        raise out_of_memory(what, nbytes) from exc


def out_of_memory(what: str, nbytes: int) -> MemoryError:
    """The MemoryError `building` raises for `what`, `nbytes` bytes: for an
    allocation on a path that enters no function before it fails (a
    `Step`'s), made in its `except MemoryError` branch."""
    return MemoryError(f"out of memory building {what} ({nbytes} bytes needed)")


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
        ValueError: more entries than could be listed (`array_bytes`: a
            `range(10**18)`), checked before any is.
        MemoryError: too many to list in this machine's memory (`building`).
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
    try:
        count = len(value)
    except OverflowError:  # a range beyond ssize_t has no len()
        raise ValueError(f"{name} has more entries than the {INDEX_MAX} a list can hold") from None
    nbytes = array_bytes(f"the entries of {name}", count, _ENTRY_BYTES)
    with building(f"the list of the {count} entries of {name}", nbytes):
        return list(value)
