"""The errors of collectives across processes (`MpiCollective`)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "CollectiveError",
    "CollectiveMismatchError",
    "CollectiveTimeoutError",
    "RankFailedError",
]


class CollectiveError(RuntimeError):
    """A collective across processes failed; the group can no longer be used.

    Attributes:
        ranks: the other ranks the failure names (each subclass says which).
        operation: what failed, e.g. "all_reduce #12".
    """

    def __init__(self, message: str, ranks: Sequence[int] = (), operation: str = "") -> None:
        super().__init__(message)
        self.ranks = tuple(ranks)
        self.operation = operation


class RankFailedError(CollectiveError):
    """A collective failed because one or more ranks did not take part.

    Attributes:
        ranks: the ranks that never joined the failed operation (empty when
            every rank had joined and the operation failed inside MPI).
        operation: what failed, e.g. "all_reduce #12".
    """


class CollectiveTimeoutError(RankFailedError, TimeoutError):
    """A collective did not complete within the collective's timeout; `ranks`
    names the ranks that never joined it."""


class CollectiveMismatchError(CollectiveError):
    """The ranks reached different operations (another kind, element count,
    dtype, root, mean, purpose or number): no rank ran it, and the collective
    can no longer be used. Every rank raises it, with the same list of operations.

    Attributes:
        operations: each rank's operation in words, by rank, e.g.
            "all_reduce #7 (1024 float32)".
        ranks: the ranks whose operation differs from this rank's.
        operation: this rank's operation, e.g. "all_reduce #7".
    """

    def __init__(
        self,
        message: str,
        operations: Sequence[str] = (),
        ranks: Sequence[int] = (),
        operation: str = "",
    ) -> None:
        super().__init__(message, ranks, operation)
        self.operations = tuple(operations)
