"""`CliError`: a user-facing error that the command reports in one line."""

from __future__ import annotations

__all__ = ["CliError"]


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
