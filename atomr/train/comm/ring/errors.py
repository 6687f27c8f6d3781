"""The errors of ring operations between actors (`RingCollective`)."""

from __future__ import annotations

__all__ = ["RingAbortedError", "RingTimeoutError"]


class RingAbortedError(RuntimeError):
    """A ring operation was abandoned because another member failed."""


class RingTimeoutError(TimeoutError):
    """A member waited longer than the ring's timeout for a chunk."""
