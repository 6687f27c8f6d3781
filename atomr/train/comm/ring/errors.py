"""The errors of ring operations between actors (`RingCollective`)."""

from __future__ import annotations

__all__ = ["RingAbortedError", "RingMismatchError", "RingTimeoutError"]


class RingAbortedError(RuntimeError):
    """A ring operation was abandoned because another member failed."""


class RingTimeoutError(TimeoutError):
    """A member waited longer than the ring's timeout for a chunk."""


class RingMismatchError(ValueError):
    """A member's neighbour holds a buffer of another length or dtype (the
    members of one operation must hold buffers of one length and dtype)."""
