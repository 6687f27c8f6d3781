"""Ring all-reduce between actors: reduce-scatter, then all-gather.

Each member owns a flat buffer (a replica's gradient) of `size` elements,
cut into `n` contiguous chunks. Members form a ring `0 -> 1 -> ... -> n-1 -> 0`
and exchange chunks as `RingChunk` actor messages:

    reduce-scatter, step s = 0..n-2 (member r):
        send chunk (r - s) mod n to r+1;  receive chunk (r - s - 1) mod n
        from r-1 and add it into its own
        -> afterwards member r holds the full sum of chunk (r + 1) mod n
    all-gather, step s = 0..n-2:
        send chunk (r + 1 - s) mod n to r+1;  receive chunk (r - s) mod n
        from r-1 and overwrite its own
        -> afterwards every member holds the whole sum, bit for bit the same

Each member sends and receives `2 (n-1) / n` of the buffer, whatever `n`.
Every chunk's sum is computed once, by one member, and then copied, so all
members end with identical bits.

Pieces:
- `RingReduce` / `RingBroadcast` / `RingChunk` / `RingAbort` / `RingPing`:
  the messages (an actor that wants to take part answers them).
- `RingBuffer`: what a member must offer (read / add / write a chunk).
- `RingMember`: the member side, to embed in an actor's `receive`
  (`ReplicaActor` does; a user-written replica can too).
- `RingAllReduce`: the `Collective` that drives the members.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np

from atomr.actor import ActorRef, Context
from atomr.train._fanout import failed_indices
from atomr.train.comm.collective import Collective

__all__ = [
    "RingAbort",
    "RingAbortedError",
    "RingAllReduce",
    "RingBroadcast",
    "RingBuffer",
    "RingChunk",
    "RingMember",
    "RingPing",
    "RingReduce",
    "RingTimeoutError",
]

_session_ids = itertools.count(1)


class RingAbortedError(RuntimeError):
    """A ring operation was abandoned because another member failed."""


class RingTimeoutError(TimeoutError):
    """A member waited longer than the ring's timeout for a chunk."""


@dataclass(frozen=True, eq=False)
class RingReduce:
    """Ask a member to take part in an all-reduce; answered (after the sum is
    in its buffer) with a host copy of the reduced buffer when `want_result`,
    else None.

    Attributes:
        session: id shared by the members of one operation.
        peers: every member's `ActorRef`, in ring order.
        rank: this member's position in `peers`.
        want_result: answer with a host copy of the reduced buffer.
    """

    session: int
    peers: tuple[ActorRef, ...]
    rank: int
    want_result: bool = False


@dataclass(frozen=True, eq=False)
class RingBroadcast:
    """Ask a member to take part in a broadcast of `root`'s buffer along the
    ring; answered with None once its buffer holds the root's.

    Attributes:
        session: id shared by the members of one operation.
        peers: every member's `ActorRef`, in ring order.
        rank: this member's position in `peers`.
        root: the rank whose buffer is copied.
    """

    session: int
    peers: tuple[ActorRef, ...]
    rank: int
    root: int = 0


@dataclass(frozen=True, eq=False)
class RingChunk:
    """One chunk on its way to the next member (told, never asked).

    Attributes:
        session: the operation.
        phase: "rs" (reduce-scatter), "ag" (all-gather) or "bc" (broadcast).
        step: the step of the phase (the chunk index for "bc").
        data: a host copy of the chunk.
    """

    session: int
    phase: str
    step: int
    data: np.ndarray


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


_MESSAGES = (RingReduce, RingBroadcast, RingChunk, RingAbort, RingPing)


class RingBuffer(Protocol):
    """The flat buffer a ring member contributes (the methods that change it
    run the work on the member's device thread)."""

    @property
    def ring_size(self) -> int:
        """Number of elements of the buffer."""
        ...

    async def read_chunk(self, lo: int, hi: int) -> np.ndarray:
        """Elements `lo:hi` as a host array the caller only reads: a copy, or
        (for a buffer in host memory) a view. A view is safe: the
        ring never changes a chunk of a member while a peer may still be
        reading it (a chunk is overwritten only by its full sum, which exists
        only after every peer has added the chunk it was sent)."""
        ...

    async def add_chunk(self, lo: int, hi: int, data: np.ndarray) -> None:
        """`buffer[lo:hi] += data`."""
        ...

    async def write_chunk(self, lo: int, hi: int, data: np.ndarray) -> None:
        """`buffer[lo:hi] = data`."""
        ...


def chunk_bounds(size: int, n: int) -> list[tuple[int, int]]:
    """`n` contiguous `(lo, hi)` ranges covering `0..size` (sizes differ by <= 1).

    Args:
        size: elements (>= 0).
        n: chunks (>= 1).

    Returns:
        The ranges in order.
    """
    q, r = divmod(size, n)
    bounds, lo = [], 0
    for i in range(n):
        hi = lo + q + (1 if i < r else 0)
        bounds.append((lo, hi))
        lo = hi
    return bounds


class RingMember:
    """The member side of the ring, embedded in an actor.

    Call `handles(message)` in the actor's `receive`, and when it is true
    return `member.receive(message, self.context)`. `RingReduce` and
    `RingBroadcast` are answered later (a deferred reply), so the actor keeps
    taking the `RingChunk`s its neighbours send meanwhile. When the member's
    own buffer work fails (not an abort or a timeout), the asker gets the
    error and the actor fails too, so its supervisor decides (e.g. restart).

    Args:
        buffer: the member's buffer.
        timeout: seconds to wait for any one chunk before failing with
            `RingTimeoutError`.
    """

    def __init__(self, buffer: RingBuffer, timeout: float = 60.0) -> None:
        self.buffer = buffer
        self.timeout = float(timeout)
        self._inbox: dict[tuple[int, str, int], asyncio.Future[np.ndarray]] = {}
        self._closed: deque[int] = deque(maxlen=256)

    @staticmethod
    def handles(message: Any) -> bool:
        """True for the ring's messages."""
        return isinstance(message, _MESSAGES)

    def receive(self, message: Any, context: Context) -> Any:
        """Handle a ring message (see the class docstring).

        Args:
            message: a ring message.
            context: the owning actor's context (for the deferred reply).

        Returns:
            True for `RingPing`, None otherwise (`RingReduce` and
            `RingBroadcast` are answered through a deferred reply, with the
            operation's error if it fails).
        """
        if isinstance(message, RingChunk):
            if message.session not in self._closed:
                fut = self._slot((message.session, message.phase, message.step))
                if not fut.done():
                    fut.set_result(message.data)
            return None
        if isinstance(message, RingAbort):
            self._abort(message.session)
            return None
        if isinstance(message, RingPing):
            return True
        reply = context.defer()
        context.create_task(self._run(message, reply))
        return None

    def _slot(self, key: tuple[int, str, int]) -> asyncio.Future[np.ndarray]:
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

    async def _recv(self, session: int, phase: str, step: int) -> np.ndarray:
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

    async def _run(self, message: RingReduce | RingBroadcast, reply: Any) -> None:
        try:
            if isinstance(message, RingReduce):
                result = await self._reduce(message)
            else:
                await self._broadcast(message)
                result = None
        except Exception as exc:
            self._abort(message.session)
            reply.set_exception(exc)
            if not isinstance(exc, RingAbortedError | RingTimeoutError):
                raise  # the member itself failed: its supervisor decides
            return
        self._abort(message.session)  # close the session: late chunks are dropped
        reply.set_result(result)

    async def _reduce(self, msg: RingReduce) -> np.ndarray | None:
        n, r, buf = len(msg.peers), msg.rank, self.buffer
        bounds = chunk_bounds(buf.ring_size, n)
        nxt = msg.peers[(r + 1) % n]
        for phase, send_of, recv_of in (
            ("rs", lambda s: (r - s) % n, lambda s: (r - s - 1) % n),
            ("ag", lambda s: (r + 1 - s) % n, lambda s: (r - s) % n),
        ):
            for s in range(n - 1):
                lo, hi = bounds[send_of(s)]
                nxt.tell(RingChunk(msg.session, phase, s, await buf.read_chunk(lo, hi)))
                data = await self._recv(msg.session, phase, s)
                lo, hi = bounds[recv_of(s)]
                if phase == "rs":
                    await buf.add_chunk(lo, hi, data)
                else:
                    await buf.write_chunk(lo, hi, data)
        if msg.want_result:
            result = await buf.read_chunk(0, buf.ring_size)
            return result if result.base is None else result.copy()  # the asker's own
        return None

    async def _broadcast(self, msg: RingBroadcast) -> None:
        n, r, buf = len(msg.peers), msg.rank, self.buffer
        distance = (r - msg.root) % n
        nxt = msg.peers[(r + 1) % n]
        for c, (lo, hi) in enumerate(chunk_bounds(buf.ring_size, n)):
            if distance == 0:
                data = await buf.read_chunk(lo, hi)
            else:
                data = await self._recv(msg.session, "bc", c)
                await buf.write_chunk(lo, hi, data)
            if distance < n - 1:
                nxt.tell(RingChunk(msg.session, "bc", c, data))


async def _until_failure(
    tasks: Sequence[asyncio.Future[Any]], interrupt: asyncio.Future[BaseException] | None
) -> bool:
    """Wait until every task is done or one has failed, or `interrupt` is done.

    Returns:
        True when `interrupt` ended the wait.
    """
    waiting: set[asyncio.Future[Any]] = set(tasks)
    while waiting:
        watched = waiting if interrupt is None else waiting | {interrupt}
        done, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
        if interrupt is not None and interrupt.done():
            return True
        waiting -= done
        if any(t.exception() is not None for t in done):
            return False
    return False


class RingAllReduce(Collective):
    """The ring all-reduce as a `Collective` whose participants are actors
    answering the ring messages (each contributes the buffer it owns).

    Args:
        timeout: seconds a member waits for one chunk (the whole operation's
            asks wait a little longer).

    Raises:
        ValueError: `timeout` is not positive.
    """

    members_hold_buffers: ClassVar[bool] = True

    def __init__(self, timeout: float = 60.0) -> None:
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0, got {timeout}")
        self.timeout = float(timeout)

    async def _drive(
        self,
        refs: Sequence[ActorRef],
        messages: list[Any],
        session: int,
        interrupt: asyncio.Future[BaseException] | None,
    ) -> list[Any]:
        tasks = [
            asyncio.ensure_future(ref.ask(m, timeout=self.timeout * 2 + 5.0))
            for ref, m in zip(refs, messages, strict=True)
        ]
        interrupted = await _until_failure(tasks, interrupt)
        if interrupted or any(t.exception() is not None for t in tasks if t.done()):
            for ref in refs:
                ref.tell(RingAbort(session))
        results = list(await asyncio.gather(*tasks, return_exceptions=True))
        failed = failed_indices(results)
        # the members that failed on their own (not merely aborted by us)
        own = [i for i in failed if not isinstance(results[i], RingAbortedError)]
        if interrupted and interrupt is not None and not own:
            cause = interrupt.result()
            cause.failed_workers = []  # type: ignore[attr-defined]
            cause.add_note(f"ring session {session}: interrupted; aborted on every member")
            raise cause
        if failed:
            own = own or failed
            error: BaseException = results[own[0]]
            error.failed_workers = own  # type: ignore[attr-defined]
            error.worker_index = own[0]  # type: ignore[attr-defined]
            error.add_note(f"ring session {session}: raised by member {own[0]}")
            raise error
        return results

    @staticmethod
    def _refs(buffers: Sequence[Any]) -> tuple[ActorRef, ...]:
        if not isinstance(buffers, Sequence) or len(buffers) == 0:
            raise ValueError("a ring needs at least one member ActorRef")
        for k, ref in enumerate(buffers):
            if not isinstance(ref, ActorRef):
                raise TypeError(f"ring member {k} must be an ActorRef, got {type(ref).__name__}")
        return tuple(buffers)

    async def all_reduce(
        self,
        buffers: Sequence[Any],
        *,
        result_from: int | None = None,
        interrupt: asyncio.Future[BaseException] | None = None,
    ) -> np.ndarray | None:
        """Sum the members' buffers; afterwards every member holds the sum.

        Args:
            buffers: the members' `ActorRef`s, in ring order.
            result_from: also return a host copy of this member's reduced
                buffer.
            interrupt: a future the caller resolves with an exception to
                abandon the operation at once, e.g. from its supervision
                decider when a member was resumed after crashing on a told
                `RingChunk` (that chunk is lost, so the ring would otherwise
                stall until the timeout).

        Returns:
            That copy, or None.

        Raises:
            TypeError, ValueError: not a non-empty list of `ActorRef`s.
            Exception: the first failing member's own error (attribute
                `failed_workers` lists the members that failed; the others
                were told to abort, and no buffer is in a defined state),
                or the exception `interrupt` was resolved with
                (`failed_workers` empty), once every member has aborted.
        """
        refs = self._refs(buffers)
        session = next(_session_ids)
        msgs = [
            RingReduce(session, refs, r, want_result=(r == result_from)) for r in range(len(refs))
        ]
        results = await self._drive(refs, msgs, session, interrupt)
        return None if result_from is None else results[result_from]

    async def broadcast(
        self,
        buffers: Sequence[Any],
        root: int = 0,
        *,
        interrupt: asyncio.Future[BaseException] | None = None,
    ) -> None:
        """Copy member `root`'s buffer into every other member's, along the ring.

        `interrupt` as for `all_reduce`.

        Raises:
            IndexError: `root` out of range.
            TypeError, ValueError, Exception: as `all_reduce`.
        """
        refs = self._refs(buffers)
        if not 0 <= root < len(refs):
            raise IndexError(f"root {root} out of range for {len(refs)} members")
        session = next(_session_ids)
        msgs = [RingBroadcast(session, refs, r, root) for r in range(len(refs))]
        await self._drive(refs, msgs, session, interrupt)

    async def barrier(self, buffers: Sequence[Any] = ()) -> None:
        """Wait until every member has handled the messages sent to it so far.

        Args:
            buffers: the members' `ActorRef`s (none: returns at once).
        """
        refs = tuple(buffers)
        if refs:
            await asyncio.gather(*(ref.ask(RingPing(), timeout=self.timeout) for ref in refs))
