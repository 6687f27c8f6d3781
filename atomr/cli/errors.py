"""`CliError`: a user-facing error that the command reports in one line;
`reported_as`: the one line, if any, of another error."""

from __future__ import annotations

__all__ = ["CliError", "reported_as"]


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


def reported_as(error: BaseException) -> CliError | None:
    """The `CliError` the command reports `error` as: itself; an `OSError`
    (an unwritable path, say) or a `CheckpointError` with its message and
    exit status 1; None for anything else (a bug: its traceback is printed)."""
    if isinstance(error, CliError):
        return error
    # here, not at the top: the command imports this module before the
    # training layer, so that a Ctrl-C while that loads is one line (`app`)
    from atomr.train.core.errors import CheckpointError

    if isinstance(error, OSError | CheckpointError):
        return CliError(str(error), 1)
    return None
