"""The argparse types of the benchmark scripts' options, one rule each:
`count` (--repeat, --rounds, --batch, --steps, ...: an int of at least 1)
and `positive_real` (--op-ms, --timeout: a finite float above 0). A value
outside them is a usage error (exit 2) instead of a traceback from deep
inside a run (`min() arg is an empty sequence`, `no median for empty data`,
`negative dimensions are not allowed`)."""

from __future__ import annotations

import argparse
import math

__all__ = ["count", "positive_real"]


def count(text: str) -> int:
    """`text` as an int of at least 1.

    Raises:
        argparse.ArgumentTypeError: not an int, or below 1.
    """
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def positive_real(text: str) -> float:
    """`text` as a finite float above 0.

    Raises:
        argparse.ArgumentTypeError: not a number, not finite, or not above 0.
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be positive and finite, got {value}")
    return value
