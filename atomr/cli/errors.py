"""`CliError`: a user-facing error that the command reports in one line;
`reported_as`: the one line, if any, of another error; `count_flag`: a
count flag's check, as one line; `check_seconds`: the rule for a command's
`--timeout`."""

from __future__ import annotations

import math

from atomr._arguments import INDEX_MAX, int_at_least

__all__ = ["CliError", "check_seconds", "count_flag", "reported_as"]


class CliError(Exception):
    """A bad argument or an unusable environment, reported as one line
    (`atomr: error: <message>`) with a non-zero exit status, never a traceback.

    Args:
        message: what went wrong and, where possible, how to fix it.
        exit_code: the process exit status (2 for bad arguments, as argparse).
    """

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def count_flag(flag: str, value: int | None, low: int = 1, high: int = INDEX_MAX) -> None:
    """Check `flag`'s value, a count: None (not given), or at least `low`
    and at most `high` (by default `INDEX_MAX`: `atomr._arguments.int_at_least`,
    the one rule of counts).

    Raises:
        CliError: out of range (the message names the flag and the limit).
    """
    if value is not None:
        try:
            int_at_least(flag, value, low, high=high)
        except ValueError as exc:
            raise CliError(str(exc)) from None


def reported_as(error: BaseException) -> CliError | None:
    """The `CliError` the command reports `error` as: itself; an `OSError`
    (an unwritable path, say), a `CheckpointError` or a `MemoryError` (its
    message names what was being built and its bytes: `_arguments.building`)
    with its message and exit status 1; None for anything else (a bug: its
    traceback is printed)."""
    if isinstance(error, CliError):
        return error
    # here, not at the top: the command imports this module before the
    # training layer, so that a Ctrl-C while that loads is one line (`app`)
    from atomr.train.core.errors import CheckpointError

    if isinstance(error, OSError | CheckpointError | MemoryError):
        return CliError(str(error) or "out of memory", 1)
    return None


def check_seconds(option: str, seconds: float | None) -> None:
    """Check a time limit given on the command line (`atomr bench --timeout`,
    `atomr launch --timeout`): None (no limit) or positive and finite.

    Raises:
        CliError: 0, a negative number, NaN or infinity (exit status 2).
    """
    if seconds is not None and not (math.isfinite(seconds) and seconds > 0):
        raise CliError(f"{option} must be positive and finite, got {seconds}")
