"""Mailboxes: unbounded (default) and bounded with an overflow policy."""

from __future__ import annotations

import asyncio
import enum
from collections import deque

from atomr._arguments import int_at_least

from .envelope import Envelope
from .errors import MailboxFullError, bounded_repr
from .messages import PoisonPill

__all__ = ["DEFAULT_MAILBOX", "BoundedMailbox", "Mailbox", "OverflowPolicy"]


class OverflowPolicy(enum.Enum):
    """What a full ``BoundedMailbox`` does with one more message."""

    DROP_NEWEST = "drop_newest"
    """The new message becomes a dead letter (an ask gets ``MailboxFullError``)."""
    DROP_OLDEST = "drop_oldest"
    """The oldest queued message becomes a dead letter; the new one is queued."""
    FAIL = "fail"
    """``tell`` and ``ask`` raise ``MailboxFullError`` in the sender."""
    BACK_PRESSURE = "back_pressure"
    """``await ref.send(msg)`` and ``ask`` wait for room; a plain ``tell`` raises."""


_NO_WAITERS: deque[asyncio.Future[None]] = deque(maxlen=0)
"""The shared, always-empty waiter queue of unbounded mailboxes (nothing is
ever appended: an unbounded mailbox is never full)."""


class Mailbox:
    """An unbounded FIFO mailbox (the default).

    A ``Mailbox`` given to ``Props.with_mailbox`` is a template: every actor
    (and every restart keeps the same one) gets a fresh ``copy()``.
    """

    capacity: int | None = None
    policy: OverflowPolicy | None = None

    __slots__ = ("queue", "waiters")

    def __init__(self) -> None:
        self.queue: deque[Envelope] = deque()
        # senders waiting for room: an unbounded mailbox never has any, and an
        # empty deque per actor would cost 600 bytes
        self.waiters: deque[asyncio.Future[None]] = _NO_WAITERS

    def copy(self) -> Mailbox:
        """Return an empty mailbox with the same settings."""
        return Mailbox()

    @property
    def is_full(self) -> bool:
        """True when one more message would overflow."""
        return False

    def offer(self, envelope: Envelope) -> Envelope | None:
        """Queue ``envelope``.

        Returns:
            The envelope dropped to make room (or the new one, refused), or None.
        Raises:
            MailboxFullError: when full under ``FAIL`` or ``BACK_PRESSURE``.
        """
        self.queue.append(envelope)
        return None

    async def wait_for_room(self) -> None:
        """Wait until the mailbox is not full (returns at once when it is not).

        A sender cancelled after being woken passes the room on to the next one.
        """
        while self.is_full:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self.waiters.append(fut)
            try:
                await fut
            except asyncio.CancelledError:
                if fut.done() and not fut.cancelled():
                    self.wake_one()
                raise
            finally:
                if not fut.done():
                    fut.cancel()

    def wake_one(self) -> None:
        """Wake the first sender waiting for room."""
        waiters = self.waiters
        while waiters:
            fut = waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    def wake_all(self) -> None:
        """Wake every sender waiting for room (the actor stopped)."""
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_result(None)

    def __len__(self) -> int:
        return len(self.queue)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class _DefaultMailbox(Mailbox):
    """The settings of every default (unbounded) mailbox, one object shared by
    all: the queue is each actor's own (``ActorCell.queue``), so this one has
    none, and anything that would queue into it fails loudly."""

    __slots__ = ()

    def __init__(self) -> None:  # no queue: see the class docstring
        self.waiters = _NO_WAITERS

    def copy(self) -> Mailbox:
        """Return an empty unbounded mailbox."""
        return Mailbox()


DEFAULT_MAILBOX: Mailbox = _DefaultMailbox()
"""What an actor spawned without ``Props.with_mailbox`` has (shared)."""


class BoundedMailbox(Mailbox):
    """A mailbox holding at most ``capacity`` messages.

    Args:
        capacity: the most messages queued at once (>= 1).
        policy: what happens to one more message (see ``OverflowPolicy``).
    Raises:
        ValueError: if ``capacity`` < 1, or is beyond what a queue can index
            (`_arguments.int_at_least`).
        TypeError: if ``capacity`` is not an int (NumPy's are; a bool is
            not) or ``policy`` not an ``OverflowPolicy``.
    """

    __slots__ = ("capacity", "policy")

    def __init__(self, capacity: int, policy: OverflowPolicy = OverflowPolicy.FAIL) -> None:
        super().__init__()
        self.waiters = deque()
        capacity = int_at_least("capacity", capacity, 1)
        if not isinstance(policy, OverflowPolicy):
            raise TypeError(f"policy must be an OverflowPolicy, got {bounded_repr(policy)}")
        self.capacity: int = capacity
        self.policy: OverflowPolicy = policy

    def copy(self) -> BoundedMailbox:
        """Return an empty mailbox with the same capacity and policy."""
        return BoundedMailbox(self.capacity, self.policy)

    @property
    def is_full(self) -> bool:
        """True when ``capacity`` messages are queued."""
        return len(self.queue) >= self.capacity

    def offer(self, envelope: Envelope) -> Envelope | None:
        """Queue ``envelope``, applying the overflow policy when full.

        A ``PoisonPill`` is queued even when full, with no policy applied: it is
        how another thread stops the actor (``ref.stop()`` refuses there), so
        it is neither refused nor dropped, nor does it drop a message.

        Returns:
            The dropped envelope (DROP_NEWEST: the new one; DROP_OLDEST: the
            oldest), or None if nothing was dropped.
        Raises:
            MailboxFullError: when full under ``FAIL`` or ``BACK_PRESSURE``.
        """
        queue = self.queue
        if len(queue) < self.capacity or envelope[0].__class__ is PoisonPill:
            queue.append(envelope)
            return None
        policy = self.policy
        if policy is OverflowPolicy.DROP_NEWEST:
            return envelope
        if policy is OverflowPolicy.DROP_OLDEST:
            oldest = queue.popleft()
            queue.append(envelope)
            return oldest
        raise MailboxFullError(
            f"mailbox full ({self.capacity} messages, policy {policy.name})"
            + (
                "; use `await ref.send(msg)` to wait for room"
                if policy is OverflowPolicy.BACK_PRESSURE
                else ""
            )
        )

    def __repr__(self) -> str:
        return f"BoundedMailbox({self.capacity}, {self.policy})"
