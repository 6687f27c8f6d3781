"""``ActorRef``: the handle used to message an actor."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from .errors import ActorStoppedError, AskTimeoutError

if TYPE_CHECKING:
    from .cell import ActorCell

__all__ = ["DEFAULT_ASK_TIMEOUT", "ActorRef"]

DEFAULT_ASK_TIMEOUT = 60.0
"""Seconds an ``ask`` waits by default."""


def _expire(fut: asyncio.Future[Any], timeout: float, ref: ActorRef, message: Any) -> None:
    if not fut.done():
        fut.set_exception(
            AskTimeoutError(f"ask to {ref.path} timed out after {timeout} s (message {message!r})")
        )


def check_timeout(timeout: float | None) -> None:
    """Validate an ask timeout.

    Raises:
        TypeError: if it is not a number or None.
        ValueError: if it is not > 0.
    """
    if timeout is None:
        return
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise TypeError(
            f"timeout must be a number of seconds or None, got {type(timeout).__name__}"
        )
    if not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds or None, got {timeout}")


class ActorRef:
    """Handle to one actor. Messages from one sender to one receiver arrive in order.

    Refs compare by identity of the actor; they stay valid after the actor
    stops (messages then go to dead letters).
    """

    __slots__ = ("_cell",)

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
        """Send ``message`` without waiting (fire and forget).

        A message to a stopped actor becomes a dead letter.

        Args:
            message: any object.
            sender: who to reply to (``context.sender`` in the receiver).
        Raises:
            MailboxFullError: if the bounded mailbox is full under FAIL or
                BACK_PRESSURE (use ``await send`` to wait for room).
        """
        cell = self._cell
        if cell.accepting:
            if cell.bounded:
                cell.offer((message, sender, None))
                return
            cell.queue.append((message, sender, None))
            waiter = cell.waiter
            if waiter is not None:
                cell.waiter = None
                if not waiter.done():
                    waiter.set_result(None)
        else:
            cell.dead_letter(message, sender, "stopped")

    async def send(self, message: Any, sender: ActorRef | None = None) -> None:
        """Like ``tell``, but waits for room in a BACK_PRESSURE mailbox.

        Raises:
            MailboxFullError: if the mailbox is full under FAIL.
        """
        cell = self._cell
        if cell.bounded:
            await cell.wait_for_room()
        self.tell(message, sender)

    async def ask(self, message: Any, timeout: float | None = DEFAULT_ASK_TIMEOUT) -> Any:
        """Send ``message`` and wait for the reply.

        Args:
            message: any object.
            timeout: seconds to wait (> 0), or None to wait forever.
        Returns:
            The receiver's return value (or what it set on a deferred ``Reply``).
        Raises:
            AskTimeoutError: no reply within ``timeout``.
            ActorStoppedError: the actor is stopped, or stopped before answering.
            MailboxFullError: the bounded mailbox refused the message.
            ValueError, TypeError: for a bad timeout.
            Exception: whatever the handler raised (or answered with ``Failure``).
        """
        if timeout is not None and (timeout.__class__ is not float or not timeout > 0):
            check_timeout(timeout)
        cell = self._cell
        if not cell.accepting:
            cell.dead_letter(message, None, "stopped")
            raise ActorStoppedError(f"ask to stopped actor {cell.path} (message {message!r})")
        loop = cell.loop
        fut = loop.create_future()
        if cell.bounded:
            await cell.wait_for_room()
            if not cell.accepting:
                cell.dead_letter(message, None, "stopped")
                raise ActorStoppedError(f"ask to stopped actor {cell.path} (message {message!r})")
            cell.offer((message, None, fut))
        else:
            cell.queue.append((message, None, fut))
            waiter = cell.waiter
            if waiter is not None:
                cell.waiter = None
                if not waiter.done():
                    waiter.set_result(None)
        if timeout is None:
            return await fut
        handle = loop.call_later(timeout, _expire, fut, timeout, self, message)
        try:
            return await fut
        finally:
            handle.cancel()

    def stop(self) -> asyncio.Future[None]:
        """Ask the actor to stop (after its current message; an awaiting async
        handler is cancelled). Children stop first, then ``post_stop`` runs.

        Returns:
            A future done once the actor has fully stopped (await it or not).
        """
        cell = self._cell
        cell.request_stop()
        return cell.stopped

    def __repr__(self) -> str:
        return f"<ActorRef {self._cell.path}>"
