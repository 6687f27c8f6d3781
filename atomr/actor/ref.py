"""``ActorRef``: the handle used to message an actor, from any thread."""

from __future__ import annotations

import asyncio
from asyncio import get_running_loop
from collections.abc import Coroutine
from functools import partial
from threading import get_ident
from typing import TYPE_CHECKING, Any, TypeVar

from .ask_deadlines import AskDeadlines
from .errors import ActorStoppedError, AskTimeoutError, MailboxFullError, bounded_repr
from .mailbox import OverflowPolicy
from .stopping import waits_for_caller, why_stopped
from .threads import closed_loop, deliver_from_thread, idle_loop_error, wake_from_thread
from .timers import check_delay

if TYPE_CHECKING:
    from .cell import ActorCell

__all__ = ["DEFAULT_ASK_TIMEOUT", "ActorRef", "check_timeout"]

T = TypeVar("T")

DEFAULT_ASK_TIMEOUT = 60.0
"""Seconds an ``ask`` (or a ``send`` waiting for room) waits by default."""


_EXACT_INT_SECONDS = 1 << 53
"""An ``int`` timeout in (0, this) is its float as is (`check_delay` would
say so); any other int takes the full check (a huge one is refused there)."""

_MAX_ASK_LANES = 8
"""Distinct ask timeouts per actor served by one shared timer each; asks with
further timeouts get a timer of their own."""


def _timed_out(label: str, timeout: float | None, message: Any) -> AskTimeoutError:
    return AskTimeoutError(
        f"ask to {label} timed out after {timeout} s (message {bounded_repr(message)})"
    )


def _expire(fut: asyncio.Future[Any], timeout: float | None, ref: ActorRef, message: Any) -> None:
    if not fut.done():
        fut.set_exception(_timed_out(ref._cell.label, timeout, message))


def _ask_lane(cell: ActorCell, timeout: float) -> AskDeadlines | None:
    """The actor's shared deadline timer for asks of ``timeout`` seconds (made on
    first use), or None when it already has ``_MAX_ASK_LANES`` of them."""
    lanes = cell.ask_lanes
    if lanes is None:
        lanes = cell.ask_lanes = {}
    lane = lanes.get(timeout)
    if lane is None and len(lanes) < _MAX_ASK_LANES:
        # the error builder holds the label, not the ref: no cycle through the cell
        lane = lanes[timeout] = AskDeadlines(
            cell.loop, timeout, partial(_timed_out, cell.label, timeout)
        )
    return lane


def check_timeout(
    timeout: object, name: str = "timeout", *, optional: bool = True, finite: bool = False
) -> float | None:
    """Validate a timeout in seconds (`check_delay`: a real number, NumPy's
    scalars too), for the runtime's waits and the trainers' options alike;
    returns it as a float (None stays None).

    Args:
        timeout: the timeout.
        name: the argument's name, for the messages.
        optional: None is taken (wait without a deadline); the messages
            offer None only then.
        finite: infinity is refused.

    Raises:
        TypeError: if it is not a real number (or None, where `optional`).
        ValueError: if it is not > 0 (NaN included), is infinite where
            `finite`, or is an int too large for a float.
    """
    if timeout is None and optional:
        return None
    return check_delay(name, timeout, allow_zero=False, or_none=optional, finite=finite)  # type: ignore[arg-type]


async def _on_actor_loop(cell: ActorCell, coro: Coroutine[Any, Any, T], timeout: float | None) -> T:
    """Run ``coro`` on ``cell``'s loop and wait for it here (on another loop,
    mostly another thread's), at most ``timeout`` seconds (then it is
    cancelled there).

    Raises:
        ActorStoppedError: if the actor's loop is closed.
        RuntimeError: if that loop is this thread's and is not running (it
            could not run before this one returns).
        TimeoutError: past ``timeout``.
    """
    loop = cell.loop
    if get_ident() == cell.thread_id and not loop.is_running() and not loop.is_closed():
        coro.close()
        raise RuntimeError(idle_loop_error(cell.label))
    try:
        future = asyncio.run_coroutine_threadsafe(coro, loop)
    except RuntimeError:  # the loop is closed
        coro.close()
        raise closed_loop(cell) from None
    async with asyncio.timeout(timeout):
        return await asyncio.wrap_future(future)


def _check_not_from_another_loop(cell: ActorCell) -> None:
    """Refuse a call on the actor's thread from a running loop that is not
    the actor's (which then cannot run: see ``idle_loop_error``).

    Raises:
        ActorStoppedError: the actor's loop is closed.
        RuntimeError: it is open but not running.
    """
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:  # plain code of the actor's thread, between its loop's runs
        return
    loop = cell.loop
    if running is not loop:
        if loop.is_closed():
            raise closed_loop(cell)
        raise RuntimeError(idle_loop_error(cell.label))


def _withdraw(cell: ActorCell, fut: asyncio.Future[Any] | None) -> None:
    """Take back the ask of ``fut`` (None: not queued yet), which the actor's
    loop, not running, cannot have handled: as if it had never been sent."""
    if fut is None:
        return
    fut.cancel()
    cell.remove_ask(fut)


class ActorRef:
    """Handle to one actor. Messages from one sender to one receiver arrive in order.

    Refs compare by identity of the actor; they stay valid after the actor
    stops (messages then go to dead letters). ``tell``, ``ask`` and ``send``
    work from any thread and any event loop; ``stop`` refuses other threads.
    """

    __slots__ = ("__weakref__", "_cell")

    def __init__(self, cell: ActorCell) -> None:
        self._cell = cell

    @property
    def path(self) -> str:
        """The actor's path, e.g. ``atomr://demo/user/parent/child``."""
        return self._cell.path

    @property
    def name(self) -> str:
        """The actor's name (last element of the path)."""
        return self._cell.name

    @property
    def is_alive(self) -> bool:
        """True until the actor starts stopping."""
        return self._cell.accepting

    def tell(self, message: Any, sender: ActorRef | None = None) -> None:
        """Send ``message`` without waiting (fire and forget); from any thread.

        A message to a stopped actor becomes a dead letter. From another
        thread, a message that a full bounded mailbox refuses becomes a dead
        letter too (the thread is not told); a ``PoisonPill`` is queued even
        when full.

        Args:
            message: any object.
            sender: who to reply to (``context.sender`` in the receiver).
        Raises:
            MailboxFullError: on the actor's loop, if the bounded mailbox is
                full under FAIL or BACK_PRESSURE (use ``await send`` to wait for room).
            ActorStoppedError: if the actor's loop is closed and the actor has
                to be woken (on its own thread, a later tell is a dead letter).
        """
        cell = self._cell
        if cell.accepting and not cell.bounded:
            cell.queue.append((message, sender, None))
            waiter = cell.waiter
            if waiter is not None:  # the actor sleeps: wake it, on its own loop
                if get_ident() == cell.thread_id:
                    cell.waiter = None
                    if not waiter.done():
                        try:
                            waiter.set_result(None)
                        except RuntimeError:  # its loop is closed: it never wakes
                            cell.queue.pop()
                            raise closed_loop(cell) from None
                else:
                    wake_from_thread(cell)
        elif get_ident() != cell.thread_id:
            deliver_from_thread(cell, (message, sender, None))
        elif cell.accepting:
            cell.offer((message, sender, None))
        else:
            cell.dead_letter(message, sender, "stopped")

    async def send(
        self,
        message: Any,
        sender: ActorRef | None = None,
        timeout: float | None = DEFAULT_ASK_TIMEOUT,
    ) -> None:
        """Like ``tell``, but waits for room in a BACK_PRESSURE mailbox.

        Args:
            message: any object.
            sender: who to reply to.
            timeout: seconds to wait for room (> 0), or None to wait as long as it takes.
        Raises:
            MailboxFullError: if the mailbox is full under FAIL, or still full
                after ``timeout`` seconds.
            RuntimeError: as ``ask``, from another loop of the actor's thread.
            ValueError, TypeError: for a bad timeout.
        """
        timeout = check_timeout(timeout)
        cell = self._cell
        if get_running_loop() is not cell.loop:
            try:
                return await _on_actor_loop(cell, self.send(message, sender, timeout), timeout)
            except TimeoutError:
                raise self._still_full(timeout) from None
        if cell.bounded and cell.mailbox.policy is OverflowPolicy.BACK_PRESSURE:
            try:
                async with asyncio.timeout(timeout):
                    await cell.wait_for_room()
            except TimeoutError:
                raise self._still_full(timeout) from None
        self.tell(message, sender)

    def _still_full(self, timeout: float | None) -> MailboxFullError:
        return MailboxFullError(
            f"mailbox of {self._cell.label} still full after {timeout} s; message not sent"
        )

    async def ask(self, message: Any, timeout: float | None = DEFAULT_ASK_TIMEOUT) -> Any:
        """Send ``message`` and wait for the reply; from any thread or event loop.

        Args:
            message: any object.
            timeout: seconds to wait (> 0), counted from this call (time spent
                waiting for room in a BACK_PRESSURE mailbox included), or None
                to wait forever.
        Returns:
            The receiver's return value (or what it set on a deferred ``Reply``).
        Raises:
            AskTimeoutError: no reply within ``timeout``.
            ActorStoppedError: the actor is stopped, or stopped before answering,
                or its event loop is closed.
            MailboxFullError: the bounded mailbox refused the message.
            RuntimeError: the actor runs on another loop of this thread, which
                is not running (it could never answer); the message is taken
                back unhandled.
            ValueError, TypeError: for a bad timeout.
            Exception: whatever the handler raised (or answered with ``Failure``).
        """
        if timeout is not None and (timeout.__class__ is not float or not timeout > 0):
            if timeout.__class__ is int and 0 < timeout < _EXACT_INT_SECONDS:
                timeout = float(timeout)  # as check_timeout, with no call
            else:
                timeout = check_timeout(timeout)
        cell = self._cell
        if get_ident() != cell.thread_id:
            try:
                return await _on_actor_loop(cell, self.ask(message, timeout), timeout)
            except AskTimeoutError:
                raise
            except TimeoutError:
                raise _timed_out(self._cell.label, timeout, message) from None
        if not cell.accepting:
            raise self._stopped(message)
        loop = cell.loop
        fut = None
        try:
            if cell.bounded:
                fut, delay = await self._offer_bounded(message, timeout)
            else:
                fut = loop.create_future()
                cell.queue.append((message, None, fut))
                waiter = cell.waiter
                if waiter is not None:
                    cell.waiter = None
                    if not waiter.done():
                        waiter.set_result(None)
                delay = timeout
            if delay is None:
                return await fut
            lane = None
            if delay == timeout:  # not shortened by waiting for room
                lanes = cell.ask_lanes
                lane = lanes.get(delay) if lanes is not None else None
                if lane is None:
                    lane = _ask_lane(cell, delay)
            if lane is None:
                handle = loop.call_later(delay, _expire, fut, timeout, self, message)
                try:
                    return await fut
                finally:
                    handle.cancel()
            lane.add(fut, message)
            try:
                return await fut
            finally:
                lane.settle()
        except RuntimeError:
            # a loop closed under the actor (this thread's earlier one), or
            # awaited from another loop of this thread while the actor's does
            # not run (asyncio refuses its future): checked only here, so the
            # ask's hot path pays nothing
            if loop.is_closed():
                raise closed_loop(cell) from None
            if get_running_loop() is not loop:
                _withdraw(cell, fut)
                raise RuntimeError(idle_loop_error(cell.label)) from None
            raise

    async def _offer_bounded(
        self, message: Any, timeout: float | None
    ) -> tuple[asyncio.Future[Any], float | None]:
        """Queue an ask in a bounded mailbox (waiting for room under BACK_PRESSURE,
        within the ask's timeout). Returns its future and the time left.

        Raises:
            AskTimeoutError: no room within ``timeout``.
            ActorStoppedError, MailboxFullError: as ``ask``.
        """
        cell = self._cell
        loop = cell.loop
        deadline = None if timeout is None else loop.time() + timeout
        if cell.mailbox.policy is OverflowPolicy.BACK_PRESSURE:
            try:
                async with asyncio.timeout_at(deadline):
                    await cell.wait_for_room()
            except TimeoutError:
                raise _timed_out(self._cell.label, timeout, message) from None
            if not cell.accepting:
                raise self._stopped(message)
        fut = loop.create_future()
        cell.offer((message, None, fut))
        return fut, None if deadline is None else max(deadline - loop.time(), 0.0)

    def _stopped(self, message: Any) -> ActorStoppedError:
        cell = self._cell
        cell.dead_letter(message, None, "stopped")
        return ActorStoppedError(
            f"ask to stopped actor {cell.label} (message {bounded_repr(message)})"
            + why_stopped(cell)
        )

    def stop(self) -> asyncio.Future[None]:
        """Ask the actor to stop (after its current message; an awaiting async
        handler is cancelled). Children stop first, then ``post_stop`` runs.

        Returns:
            A future done once the actor has fully stopped, or once
            ``system.terminate`` gave up waiting for it (await it or not);
            called from the actor itself or one of its descendants (whose
            stop it waits for), one done at once: waiting there would wait
            for the caller.
        Raises:
            RuntimeError: if called from another thread than the actor's loop
                (there, ``tell(PoisonPill())`` stops it), or from another loop
                of its thread while its own does not run; nothing is changed.
            ActorStoppedError: if the actor's loop is closed (it cannot run
                again, ``post_stop`` included).
        """
        cell = self._cell
        if get_ident() != cell.thread_id:
            raise RuntimeError(
                f"stop() of {cell.label} called from another thread than its event loop's; "
                "tell it PoisonPill() instead, or use loop.call_soon_threadsafe(ref.stop)"
            )
        _check_not_from_another_loop(cell)
        cell.request_stop()
        if waits_for_caller(cell):
            done: asyncio.Future[None] = cell.loop.create_future()
            done.set_result(None)
            return done
        return asyncio.shield(cell.stopped)  # a caller giving up cancels only its own wait

    def __repr__(self) -> str:
        return f"<ActorRef {self._cell.label}>"
