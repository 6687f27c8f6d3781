"""`int_at_least`: the one check of a count argument (an int, not a bool,
at least some bound), shared by the runtime's and the trainers' options."""

from __future__ import annotations

__all__ = ["int_at_least"]


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
