"""The messages of the ring: what `RingCollective` asks each member, and what
the members tell each other.

An actor that takes part in the ring answers them through a `RingMember`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from atomr.actor import ActorRef

__all__ = [
    "RING_MESSAGES",
    "RingAbort",
    "RingAllGather",
    "RingBroadcast",
    "RingChunk",
    "RingOperation",
    "RingPing",
    "RingReduce",
    "RingReduceScatter",
]


@dataclass(frozen=True, eq=False)
class RingOperation:
    """What every ask for a ring operation carries (the member answers once
    its part is done, with the operation's error if it fails).

    Attributes:
        session: id shared by the members of one operation.
        peers: every member's `ActorRef`, in ring order.
        rank: this member's position in `peers`.
    """

    session: int
    peers: tuple[ActorRef, ...]
    rank: int


@dataclass(frozen=True, eq=False)
class RingReduce(RingOperation):
    """Take part in an all-reduce (reduce-scatter, then all-gather);
    answered, once the whole sum is in the member's buffer, with a host copy
    of that buffer when `want_result`, else None."""

    want_result: bool = False


@dataclass(frozen=True, eq=False)
class RingReduceScatter(RingOperation):
    """Take part in a reduce-scatter; answered, once chunk `rank` of the
    member's buffer holds the sum of that chunk, with a host copy of the
    chunk when `want_result`, else None."""

    want_result: bool = False


@dataclass(frozen=True, eq=False)
class RingAllGather(RingOperation):
    """Take part in an all-gather (the member contributes chunk `rank` of its
    buffer); answered, once its buffer holds every member's chunk, with a
    host copy of the buffer when `want_result`, else None."""

    want_result: bool = False


@dataclass(frozen=True, eq=False)
class RingBroadcast(RingOperation):
    """Take part in a broadcast of `root`'s buffer along the ring; answered
    with None once the member's buffer holds the root's.

    Attributes:
        root: the rank whose buffer is copied.
    """

    root: int = 0


@dataclass(frozen=True, eq=False)
class RingChunk:
    """One chunk on its way to the next member (told, never asked).

    Attributes:
        session: the operation.
        phase: "rs" (reduce-scatter), "ag" (all-gather) or "bc" (broadcast).
        step: the step of the phase (the chunk index for "bc").
        data: the chunk: a host copy, or a view of the sender's buffer that
            the receiver only reads (see `RingBuffer.read_chunk`).
        size: the length of the sender's whole buffer (the receiver checks
            it is its own: each member cuts its own buffer into chunks).
    """

    session: int
    phase: str
    step: int
    data: np.ndarray
    size: int


@dataclass(frozen=True, slots=True)
class RingAbort:
    """Abandon an operation: pending waits of `session` fail with
    `RingAbortedError` (told, never asked).

    Attributes:
        session: the operation to abandon.
    """

    session: int


@dataclass(frozen=True, slots=True)
class RingPing:
    """Answered with True once every earlier message to the member is handled
    (the ring's barrier)."""


RING_MESSAGES = (RingOperation, RingChunk, RingAbort, RingPing)
"""Every ring message type (for `isinstance`)."""
