"""Collectives between actors along a ring: reduce-scatter, all-gather, the
all-reduce made of the two, broadcast and barrier.

- `messages.py`: what travels (`RingReduce`, `RingReduceScatter`,
  `RingAllGather`, `RingBroadcast`, `RingChunk`, `RingAbort`, `RingPing`).
- `member.py`: `RingMember`, the member side to embed in an actor
  (`ReplicaActor` does; a user-written replica can too), and `RingBuffer`,
  what its buffer must offer. The algorithms live there.
- `collective.py`: `RingCollective`, the `Collective` that drives the members.
- `errors.py`: `RingAbortedError`, `RingMismatchError`, `RingTimeoutError`.
"""

from atomr.train.comm.ring.collective import RingCollective
from atomr.train.comm.ring.errors import RingAbortedError, RingMismatchError, RingTimeoutError
from atomr.train.comm.ring.member import RingBuffer, RingMember
from atomr.train.comm.ring.messages import (
    RingAbort,
    RingAllGather,
    RingBroadcast,
    RingChunk,
    RingOperation,
    RingPing,
    RingReduce,
    RingReduceScatter,
)

__all__ = [
    "RingAbort",
    "RingAbortedError",
    "RingAllGather",
    "RingBroadcast",
    "RingBuffer",
    "RingChunk",
    "RingCollective",
    "RingMember",
    "RingMismatchError",
    "RingOperation",
    "RingPing",
    "RingReduce",
    "RingReduceScatter",
    "RingTimeoutError",
]
