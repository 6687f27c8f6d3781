"""`RingMember`: the member side of the ring, to embed in an actor's
`receive`, and `RingBuffer`, what the member's buffer must offer.

Member r of n holds a flat buffer cut into n chunks (`split_bounds(size, n)`,
indices mod n). In every step of a phase it sends one chunk to member r+1 and
receives one from member r-1; each phase has n-1 steps s = 0..n-2:

    reduce-scatter: send chunk r-s-1; receive chunk r-s-2 and add it into
                    its own        -> member r holds the full sum of chunk r
    all-gather:     send chunk r-s;   receive chunk r-s-1 and overwrite its
                    own            -> every member holds every chunk of r
    all-reduce:     reduce-scatter, then all-gather
    broadcast:      chunk by chunk, from the root along the ring

Each member sends and receives `(n-1)/n` of the buffer per phase, whatever
n. Every chunk's sum is computed once, by one member, and then copied, so
all members end with identical bits.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Protocol

import numpy as np

from atomr.actor import Context, Reply
from atomr.actor.reply import fail_deferred
from atomr.actor.timers import check_delay
from atomr.train.comm._checks import check_dtype
from atomr.train.comm.ring.errors import RingAbortedError, RingMismatchError, RingTimeoutError
from atomr.train.comm.ring.messages import (
    RING_MESSAGES,
    RingAbort,
    RingAllGather,
    RingBroadcast,
    RingChunk,
    RingOperation,
    RingPing,
    RingReduce,
    RingReduceScatter,
)
from atomr.train.core.partition import split_bounds

__all__ = ["RingBuffer", "RingMember"]


class RingBuffer(Protocol):
    """The flat buffer a ring member contributes (the methods that change it
    run the work on the member's device thread)."""

    @property
    def ring_size(self) -> int:
        """Number of elements of the buffer."""
        ...

    async def read_chunk(self, lo: int, hi: int) -> np.ndarray:
        """Elements `lo:hi` as a host array the caller only reads: a copy, or
        (for a buffer in host memory) a view. A view is safe: the ring never
        changes a chunk of a member while a peer may still be reading it (in
        a reduce-scatter a member never changes a chunk after sending it; a
        chunk is overwritten only by its full sum, which exists only after
        every peer has added the chunk it was sent; and an operation ends
        only when every member has used what it received)."""
        ...

    async def add_chunk(self, lo: int, hi: int, data: np.ndarray) -> None:
        """`buffer[lo:hi] += data`."""
        ...

    async def write_chunk(self, lo: int, hi: int, data: np.ndarray) -> None:
        """`buffer[lo:hi] = data`."""
        ...


class RingMember:
    """The member side of the ring, embedded in an actor.

    Call `handles(message)` in the actor's `receive`, and when it is true
    return `member.receive(message, self.context)`. The operations
    (`RingReduce`, `RingReduceScatter`, `RingAllGather`, `RingBroadcast`)
    are answered later (a deferred reply), so the actor keeps taking the
    `RingChunk`s its neighbours send meanwhile. When the member's own buffer
    work fails (not an abort, a timeout or a `RingMismatchError`: a
    neighbour whose buffer differs in length or dtype, found before the
    chunk it sent is used), the asker gets the error, marked
    `atomr.actor.actor_failed` (the member's state may be lost), and the
    actor fails too, so its supervisor decides (e.g. restart). A buffer of
    a dtype the operation does not take (`comm._checks.check_dtype`, every
    collective's rule) is refused with `TypeError` before anything is sent,
    the actor intact.

    Args:
        buffer: the member's buffer.
        timeout: seconds to wait for any one chunk before failing with
            `RingTimeoutError`.

    Raises:
        TypeError, ValueError: `timeout` is not a positive number of
            seconds (as `RingCollective`).
    """

    def __init__(self, buffer: RingBuffer, timeout: float = 60.0) -> None:
        self.timeout = check_delay("timeout", timeout, allow_zero=False)
        self.buffer = buffer
        self._inbox: dict[tuple[int, str, int], asyncio.Future[RingChunk]] = {}
        self._closed: deque[int] = deque(maxlen=256)

    @staticmethod
    def handles(message: Any) -> bool:
        """True for the ring's messages."""
        return isinstance(message, RING_MESSAGES)

    def receive(self, message: Any, context: Context) -> Any:
        """Handle a ring message (see the class docstring).

        Args:
            message: a ring message.
            context: the owning actor's context (for the deferred reply).

        Returns:
            True for `RingPing`, None otherwise (the operations are answered
            through a deferred reply, with the operation's error if it fails).
        """
        if isinstance(message, RingChunk):
            if message.session not in self._closed:
                fut = self._slot((message.session, message.phase, message.step))
                if not fut.done():
                    fut.set_result(message)
            return None
        if isinstance(message, RingAbort):
            self._abort(message.session)
            return None
        if isinstance(message, RingPing):
            return True
        reply = context.defer()
        context.create_task(self._run(message, reply))
        return None

    # -- the operations ---------------------------------------------------------

    async def _perform(self, msg: RingOperation, dtype: np.dtype) -> np.ndarray | None:
        """This member's part of one operation (its buffer of `dtype`,
        checked); returns what its asker wants."""
        if isinstance(msg, RingBroadcast):
            await self._broadcast(msg, dtype)
            return None
        size = self.buffer.ring_size
        bounds = split_bounds(size, len(msg.peers))
        result_at = (0, size)
        if isinstance(msg, RingReduce):  # the all-reduce: its two phases, in order
            await self._reduce_scatter(msg, bounds)
            await self._all_gather(msg, bounds)
        elif isinstance(msg, RingReduceScatter):
            await self._reduce_scatter(msg, bounds)
            result_at = bounds[msg.rank]
        elif isinstance(msg, RingAllGather):
            await self._all_gather(msg, bounds)
        else:
            raise TypeError(f"not a ring operation: {type(msg).__name__}")
        if not msg.want_result:
            return None
        result = await self.buffer.read_chunk(*result_at)
        return result if result.base is None else result.copy()  # the asker's own

    async def _reduce_scatter(self, msg: RingOperation, bounds: list[tuple[int, int]]) -> None:
        """Step s: send chunk r-s-1, add chunk r-s-2 from r-1; ends with the
        full sum of chunk r."""
        n, r = len(bounds), msg.rank
        for s in range(n - 1):
            data = await self._pass(msg, "rs", s, bounds[(r - s - 1) % n])
            lo, hi = bounds[(r - s - 2) % n]
            await self.buffer.add_chunk(lo, hi, data)

    async def _all_gather(self, msg: RingOperation, bounds: list[tuple[int, int]]) -> None:
        """Step s: send chunk r-s, overwrite chunk r-s-1 with r-1's; starts
        from chunk r, ends with every chunk."""
        n, r = len(bounds), msg.rank
        for s in range(n - 1):
            data = await self._pass(msg, "ag", s, bounds[(r - s) % n])
            lo, hi = bounds[(r - s - 1) % n]
            await self.buffer.write_chunk(lo, hi, data)

    async def _pass(
        self, msg: RingOperation, phase: str, step: int, send: tuple[int, int]
    ) -> np.ndarray:
        """Send chunk `send` to the next member; return the chunk the
        previous member sent in the same step.

        Raises:
            RingMismatchError: the previous member's buffer differs from this
                one's in length or dtype.
        """
        nxt = msg.peers[(msg.rank + 1) % len(msg.peers)]
        sent = await self.buffer.read_chunk(*send)
        nxt.tell(RingChunk(msg.session, phase, step, sent, self.buffer.ring_size))
        return self._accept(await self._recv(msg.session, phase, step), sent.dtype)

    def _accept(self, chunk: RingChunk, dtype: np.dtype) -> np.ndarray:
        """The data of a chunk from the previous member, once its buffer is
        known to be like this member's (length `ring_size`, `dtype`).

        Raises:
            RingMismatchError: it is not (each member cuts its own buffer, so
                chunks of buffers of other lengths do not line up).
        """
        size = self.buffer.ring_size
        if chunk.size != size or chunk.data.dtype != dtype:
            raise RingMismatchError(
                f"ring session {chunk.session}: the previous member holds a "
                f"{chunk.data.dtype} buffer of {chunk.size} elements, this one a "
                f"{dtype} buffer of {size}; every member must hold one length and dtype"
            )
        return chunk.data

    async def _broadcast(self, msg: RingBroadcast, dtype: np.dtype) -> None:
        """The root sends its chunks along the ring; every other member
        writes each chunk from its predecessor (checked to be of `dtype`,
        its buffer's) and passes it on."""
        n, r, buf = len(msg.peers), msg.rank, self.buffer
        distance = (r - msg.root) % n
        nxt = msg.peers[(r + 1) % n]
        for c, (lo, hi) in enumerate(split_bounds(buf.ring_size, n)):
            if distance == 0:
                data = await buf.read_chunk(lo, hi)
            else:
                data = self._accept(await self._recv(msg.session, "bc", c), dtype)
                await buf.write_chunk(lo, hi, data)
            if distance < n - 1:
                nxt.tell(RingChunk(msg.session, "bc", c, data, buf.ring_size))

    # -- sessions -----------------------------------------------------------------

    async def _run(self, message: RingOperation, reply: Reply) -> None:
        try:
            dtype = await self._checked_dtype(message)
        except TypeError as exc:  # the caller's mistake: this member is intact
            self._abort(message.session)
            reply.set_exception(exc)
            return
        try:
            result = await self._perform(message, dtype)
        except (RingAbortedError, RingTimeoutError, RingMismatchError) as exc:
            self._abort(message.session)  # the ring failed, not this member: answered
            reply.set_exception(exc)
            return
        except Exception as exc:
            self._abort(message.session)
            # the member itself failed (its supervisor decides, a restart loses
            # its state): answered as every error that escaped an actor is,
            # marked `actor_failed`
            fail_deferred([reply], exc, True)
            raise
        self._abort(message.session)  # close the session: late chunks are dropped
        reply.set_result(result)

    async def _checked_dtype(self, msg: RingOperation) -> np.dtype:
        """The buffer's dtype, read once per operation; refused, before
        anything is sent, when the operation does not take it: every
        collective's rule (`check_dtype`).

        Raises:
            TypeError: a sum of a dtype other than float32 / float64, or a
                copy of one that is not bool, integer, float or complex.
        """
        dtype: np.dtype = (await self.buffer.read_chunk(0, 0)).dtype
        check_dtype(dtype, sums=not isinstance(msg, RingAllGather | RingBroadcast))
        return dtype

    def _slot(self, key: tuple[int, str, int]) -> asyncio.Future[RingChunk]:
        fut = self._inbox.get(key)
        if fut is None:
            fut = self._inbox[key] = asyncio.get_running_loop().create_future()
        return fut

    def _abort(self, session: int) -> None:
        self._closed.append(session)
        for key in [k for k in self._inbox if k[0] == session]:
            fut = self._inbox.pop(key)
            if not fut.done():
                fut.set_exception(RingAbortedError(f"ring session {session} was aborted"))
                fut.exception()  # mark retrieved: a waiter, if any, still gets it

    async def _recv(self, session: int, phase: str, step: int) -> RingChunk:
        if session in self._closed:
            raise RingAbortedError(f"ring session {session} was aborted")
        key = (session, phase, step)
        fut = self._slot(key)
        try:
            return await asyncio.wait_for(asyncio.shield(fut), self.timeout)
        except TimeoutError as exc:
            raise RingTimeoutError(
                f"no {phase} chunk {step} of ring session {session} within {self.timeout}s"
            ) from exc
        finally:
            self._inbox.pop(key, None)
