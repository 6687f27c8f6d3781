"""`int_at_least`: the one check of a count argument (an int, not a bool,
at least some bound), shared by the runtime's and the trainers' options;
`real_as_float`: a real number as a float, for the finiteness checks of
numeric arguments and of the numbers a checkpoint holds."""

from __future__ import annotations

import math
from typing import SupportsFloat

__all__ = ["int_at_least", "real_as_float"]


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


def real_as_float(value: SupportsFloat) -> float:
    """`value` as a float; one beyond float's range (an int such as 10**400,
    which `float()` refuses with OverflowError) as an infinity of its sign,
    for the caller's finiteness check to refuse with its own error."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf  # type: ignore[operator]
