"""The argparse types of the benchmark scripts' options, one rule each:
`count` (--repeat, --rounds, --batch, --steps, ...: an int of at least 1),
`positive_real` (--op-ms, --timeout: a finite float above 0), `factor`
(--slow: a finite float of at least 1), `layer_sizes` (--sizes: two or more
counts, comma-separated) and `names_among(choices)` (--only: names,
comma-separated, each one of `choices`). A value outside them is a usage error (exit 2) instead of a traceback from deep
inside a run (`min() arg is an empty sequence`, `no median for empty data`,
`negative dimensions are not allowed`)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Collection

__all__ = ["count", "factor", "layer_sizes", "names_among", "positive_real"]


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


def factor(text: str) -> float:
    """`text` as a finite float of at least 1 (how many times as long).

    Raises:
        argparse.ArgumentTypeError: not a number, not finite, or below 1.
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
    if not (math.isfinite(value) and value >= 1):
        raise argparse.ArgumentTypeError(f"must be finite and >= 1, got {value}")
    return value


def layer_sizes(text: str) -> list[int]:
    """`text` ("784,1024,10") as a network's layer widths: two or more
    counts (input, hidden..., output).

    Raises:
        argparse.ArgumentTypeError: fewer than two widths, or a width that
            is not a `count`.
    """
    widths = [count(part) for part in text.split(",")]
    if len(widths) < 2:
        raise argparse.ArgumentTypeError(
            f"needs two or more widths (input and output), got {text!r}"
        )
    return widths


def names_among(choices: Collection[str]) -> Callable[[str], list[str]]:
    """The type of a comma-separated list of names, each one of `choices`
    (an unknown name would select nothing).

    Returns:
        A type that raises `argparse.ArgumentTypeError` for an empty name
        or one not among `choices` (the message lists them).
    """

    def names(text: str) -> list[str]:
        chosen = [name.strip() for name in text.split(",")]
        unknown = [repr(name) for name in chosen if name not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(
                f"unknown name {', '.join(unknown)}: choose among {', '.join(choices)}"
            )
        return chosen

    return names
