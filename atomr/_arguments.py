"""`int_at_least`: the one check of a count argument (an int, not a bool,
at least some bound), shared by the runtime's and the trainers' options;
`bool_flag`: the one check of a yes-or-no argument (a bool, not merely
truthy); `real_as_float`: a real number as a float, for the finiteness
checks of numeric arguments and of the numbers a checkpoint holds."""

from __future__ import annotations

import math
import sys
from typing import SupportsFloat

__all__ = ["bool_flag", "int_at_least", "real_as_float"]


def int_at_least(name: str, value: object, low: int = 1) -> int:
    """`value`, checked to be an int (a bool is not) of at least `low`.

    Raises:
        TypeError: not an int (the message names `name`).
        ValueError: below `low`.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    return value


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
        raise TypeError(f"{name} must be True or False, got {value!r}"[:200])
    return bool(value)


def real_as_float(value: SupportsFloat) -> float:
    """`value` as a float; one beyond float's range (an int such as 10**400,
    which `float()` refuses with OverflowError) as an infinity of its sign,
    for the caller's finiteness check to refuse with its own error."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf  # type: ignore[operator]
