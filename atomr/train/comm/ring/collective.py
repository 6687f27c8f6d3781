"""`RingCollective`: the five operations of `Collective` between actors that
take part in the ring (each answers the ring messages through a `RingMember`
and contributes the buffer it owns).

The collective is the driver: it asks every member for its part of one
operation (a *session*), and when one member fails it tells every member to
abandon the session (`RingAbort`) and raises that member's own error once
every member has stopped.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np

from atomr.actor import ActorRef
from atomr.actor.timers import check_delay
from atomr.train.comm._checks import check_root
from atomr.train.comm._fanout import failed_indices
from atomr.train.comm.collective import Collective
from atomr.train.comm.ring.errors import RingAbortedError
from atomr.train.comm.ring.messages import (
    RingAbort,
    RingAllGather,
    RingBroadcast,
    RingOperation,
    RingPing,
    RingReduce,
    RingReduceScatter,
)

__all__ = ["RingCollective"]

_session_ids = itertools.count(1)


class RingCollective(Collective):
    """The ring algorithms as a `Collective` whose participants are actors.

    `buffers` is, for every operation, the members' `ActorRef`s in ring
    order; member k's buffer is the one its `RingMember` was given. After a
    failure (the raised error's `failed_workers` lists the members that
    failed on their own; the others were told to abort) no member's buffer
    is in a defined state.

    Args:
        timeout: seconds a member waits for one chunk (the whole operation's
            asks wait `2 * timeout + 5` seconds).

    Raises:
        TypeError: `timeout` is not a number of seconds (a bool is not).
        ValueError: `timeout` is not positive (NaN included; `check_delay`,
            the runtime's rule). Infinity waits for ever (a trainer's
            `worker_timeout=None`).
    """

    members_hold_buffers: ClassVar[bool] = True

    def __init__(self, timeout: float = 60.0) -> None:
        self.timeout = check_delay("timeout", timeout, allow_zero=False)

    async def all_reduce(
        self,
        buffers: Sequence[Any],
        *,
        result_from: int | None = None,
        interrupt: asyncio.Future[BaseException] | None = None,
    ) -> np.ndarray | None:
        """Sum the members' buffers: reduce-scatter, then all-gather;
        afterwards every member's buffer holds the sum, bit for bit the same.

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
            TypeError, ValueError: not a non-empty list of `ActorRef`s, or
                one named twice (refused before any member is asked).
            TypeError: the members' buffers are of a dtype the operation
                does not take (every collective's rule: see `Collective`),
                refused by each member before it sends anything.
            IndexError: `result_from` is not a member's index.
            TypeError: `result_from` is not an integer (a bool is not).
            RingTimeoutError: a member waited `timeout` for a chunk (a member
                stalled or out of step).
            Exception: the own error of the member that failed first
                (`ActorStoppedError` for a member that is gone), once every
                member has aborted; its attribute `failed_workers` lists
                every member that failed on its own, `worker_index` this
                one. Or the exception `interrupt` was resolved with
                (`failed_workers` empty).
        """
        return await self._operate(buffers, RingReduce, result_from, interrupt)

    async def reduce_scatter(
        self,
        buffers: Sequence[Any],
        *,
        result_from: int | None = None,
        interrupt: asyncio.Future[BaseException] | None = None,
    ) -> np.ndarray | None:
        """The first phase alone: afterwards member k's buffer holds, at
        chunk k (`split_bounds(size, n)[k]`), the sum of that chunk; its
        other chunks hold partial sums.

        Args:
            buffers, interrupt: as `all_reduce`.
            result_from: also return a host copy of this member's reduced
                chunk.

        Returns:
            That copy, or None.

        Raises:
            As `all_reduce`.
        """
        return await self._operate(buffers, RingReduceScatter, result_from, interrupt)

    async def all_gather(
        self,
        buffers: Sequence[Any],
        *,
        result_from: int | None = None,
        interrupt: asyncio.Future[BaseException] | None = None,
    ) -> np.ndarray | None:
        """The second phase alone: member k contributes chunk k of its buffer
        (`split_bounds(size, n)[k]`); afterwards every member's buffer holds
        every member's chunk.

        Args:
            buffers, interrupt: as `all_reduce`.
            result_from: also return a host copy of this member's gathered
                buffer.

        Returns:
            That copy, or None.

        Raises:
            As `all_reduce`.
        """
        return await self._operate(buffers, RingAllGather, result_from, interrupt)

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
            TypeError: `root` is not an integer; or as `all_reduce`.
            ValueError, RingTimeoutError, Exception: as `all_reduce`.
        """
        refs = _member_refs(buffers)
        root = check_root(root, len(refs))
        session = next(_session_ids)
        msgs = [RingBroadcast(session, refs, r, root) for r in range(len(refs))]
        await self._drive(refs, msgs, session, interrupt)

    async def barrier(self, buffers: Sequence[Any] = ()) -> None:
        """Wait until every member has handled the messages sent to it so far.

        Args:
            buffers: the members' `ActorRef`s (none: returns at once).

        Raises:
            TypeError: a member is not an `ActorRef`.
            ValueError: a member named twice.
            ActorStoppedError: a member is gone.
            AskTimeoutError: a member did not answer within `timeout`.
        """
        refs = _member_refs(buffers) if len(buffers) else ()
        await asyncio.gather(*(ref.ask(RingPing(), timeout=self.timeout) for ref in refs))

    # -- the driver -----------------------------------------------------------------

    async def _operate(
        self,
        buffers: Sequence[Any],
        kind: Callable[..., RingOperation],
        result_from: int | None,
        interrupt: asyncio.Future[BaseException] | None,
    ) -> np.ndarray | None:
        """Run one reducing or gathering operation on every member."""
        refs = _member_refs(buffers)
        if result_from is not None:
            result_from = check_root(result_from, len(refs), "result_from")
        session = next(_session_ids)
        msgs = [kind(session, refs, r, want_result=(r == result_from)) for r in range(len(refs))]
        results = await self._drive(refs, msgs, session, interrupt)
        return None if result_from is None else results[result_from]

    async def _drive(
        self,
        refs: Sequence[ActorRef],
        messages: list[Any],
        session: int,
        interrupt: asyncio.Future[BaseException] | None,
    ) -> list[Any]:
        """Ask every member for its part; on a failure (or `interrupt`) abort
        the session on every member, wait for all of them, and raise. Cancelled
        (its caller stopping), it aborts the session too, and cancels the asks
        not answered yet (a failure answered is read: none is left unread)."""
        tasks = [
            asyncio.ensure_future(ref.ask(m, timeout=self.timeout * 2 + 5.0))
            for ref, m in zip(refs, messages, strict=True)
        ]
        try:
            interrupted, first = await _until_failure(tasks, interrupt)
        except BaseException:
            _abandon(refs, tasks, session)
            raise
        if interrupted or first is not None:
            _abort(refs, session)
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
            culprit = first if first in own else own[0]
            error: BaseException = results[culprit]
            error.failed_workers = own  # type: ignore[attr-defined]
            error.worker_index = culprit  # type: ignore[attr-defined]
            error.add_note(f"ring session {session}: raised by member {culprit}")
            raise error
        return results


def _member_refs(buffers: Sequence[Any]) -> tuple[ActorRef, ...]:
    """The members of one operation, checked before any is asked: a
    non-empty list of distinct `ActorRef`s (a member owns one buffer, so it
    can hold one place in the ring).

    Raises:
        TypeError: an item that is not an `ActorRef`.
        ValueError: no members, or one named twice.
    """
    if not isinstance(buffers, Sequence) or len(buffers) == 0:
        raise ValueError("a ring needs at least one member ActorRef")
    places: dict[ActorRef, int] = {}
    for k, ref in enumerate(buffers):
        if not isinstance(ref, ActorRef):
            raise TypeError(f"ring member {k} must be an ActorRef, got {type(ref).__name__}")
        first = places.setdefault(ref, k)
        if first != k:
            raise ValueError(
                f"ring members {first} and {k} are the same actor ({ref.path}); "
                "each member holds one buffer, so it takes one place in the ring"
            )
    return tuple(buffers)


def _abort(refs: Sequence[ActorRef], session: int) -> None:
    """Tell every member to abandon `session` (its pending waits fail)."""
    for ref in refs:
        ref.tell(RingAbort(session))


def _abandon(refs: Sequence[ActorRef], tasks: Sequence[asyncio.Future[Any]], session: int) -> None:
    """The operation's caller gave up: every member aborts `session`; the
    asks not done are cancelled, the outcome of those done is read."""
    _abort(refs, session)
    for task in tasks:
        if not task.done():
            task.cancel()
        elif not task.cancelled():
            task.exception()


async def _until_failure(
    tasks: Sequence[asyncio.Future[Any]], interrupt: asyncio.Future[BaseException] | None
) -> tuple[bool, int | None]:
    """Wait until every task is done or one has failed, or `interrupt` is done.

    Returns:
        Whether `interrupt` ended the wait, and the index of the task that
        failed first (None when none has).
    """
    waiting: set[asyncio.Future[Any]] = set(tasks)
    while waiting:
        watched = waiting if interrupt is None else waiting | {interrupt}
        done, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
        if interrupt is not None and interrupt.done():
            return True, None
        waiting -= done
        failed = [k for k, t in enumerate(tasks) if t in done and t.exception() is not None]
        if failed:
            return False, failed[0]
    return False, None
