"""The errors of collectives across processes (`MpiCollective`)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["CollectiveError", "CollectiveTimeoutError", "RankFailedError"]


class CollectiveError(RuntimeError):
    """A collective across processes failed; the group can no longer be used."""


class RankFailedError(CollectiveError):
    """A collective failed because one or more ranks did not take part.

    Attributes:
        ranks: the ranks that never joined the failed operation (empty when
            every rank had joined and the operation failed inside MPI).
        operation: what failed, e.g. "all_reduce #12".
    """

    def __init__(self, message: str, ranks: Sequence[int] = (), operation: str = "") -> None:
        super().__init__(message)
        self.ranks = tuple(ranks)
        self.operation = operation


class CollectiveTimeoutError(RankFailedError, TimeoutError):
    """A collective did not complete within the collective's timeout; `ranks`
    names the ranks that never joined it."""
