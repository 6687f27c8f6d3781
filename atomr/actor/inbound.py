"""``Inbound``: what comes into an ``ActorCell`` and how: user messages
(``deliver``, with a bounded mailbox's overflow policy), runtime-made and timer
messages, system messages (which overtake user messages), taking queued
messages back out (a cancelled timer's tick, the ``Terminated`` of an
unwatched actor), dead letters, a request to stop, and waking the cell's loop.

A mixin of ``ActorCell`` (cell.py), which holds the state these methods use;
they run on the event loop's thread (``threads`` hands other threads' tells over).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .envelope import Envelope
from .errors import ActorStoppedError, MailboxFullError
from .mailbox import Mailbox, OverflowPolicy
from .messages import DeadLetter, Terminated
from .reply import drop_ask, share_ask
from .timers import Cancellable

if TYPE_CHECKING:
    from .cell import ActorCell
    from .ref import ActorRef
    from .system import ActorSystem

__all__ = ["Inbound", "deliver_to_several"]


class Inbound:
    """The inbound side of an ``ActorCell``: queueing, taking back, waking."""

    if not TYPE_CHECKING:  # mypy: the attributes below are ActorCell's slots
        __slots__ = ()

    if TYPE_CHECKING:  # the cell's own state (ActorCell's slots)
        accepting: bool
        bounded: bool
        dead: bool
        in_handler: bool
        interrupt: bool
        mailbox: Mailbox
        queue: deque[Envelope]
        stop_requested: bool
        sysq: list[tuple[str, Any]] | tuple[()]
        system: ActorSystem
        task: asyncio.Task[None] | None
        waiter: asyncio.Future[None] | None

        @property
        def label(self) -> str: ...

        @property
        def ref(self) -> ActorRef: ...

    def wake(self) -> None:
        """Wake the loop if it is waiting for messages."""
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def deliver(self, env: Envelope) -> None:
        """Queue ``env`` (dead letter / ActorStoppedError if stopped); on the loop thread.

        Raises:
            MailboxFullError: if a bounded mailbox refuses it (FAIL, BACK_PRESSURE).
        """
        if not self.accepting:
            self.dead_letter(env[0], env[1], "stopped")
            reply = env[2]
            if reply is not None and not reply.done():
                drop_ask(reply, ActorStoppedError(f"{self.label} is stopped"))
            return
        if self.bounded:
            self.offer(env)
            return
        self.queue.append(env)
        self.wake()

    def deliver_shared(self, env: Envelope) -> str | None:
        """Queue ``env``, whose ask other actors were given too
        (``deliver_to_several``): where this actor has stopped, or its full
        mailbox would drop or refuse it, it becomes a dead letter and its ask
        is left to the others (a full ``DROP_OLDEST`` one drops its oldest,
        as ever).

        Returns:
            None if queued, else why not ("stopped" or "mailbox full").
        """
        mailbox = self.mailbox
        if not self.accepting:
            reason = "stopped"
        elif self.bounded and mailbox.is_full and mailbox.policy is not OverflowPolicy.DROP_OLDEST:
            reason = "mailbox full"
        else:
            self.deliver(env)
            return None
        self.dead_letter(env[0], env[1], reason)
        return reason

    def offer(self, env: Envelope) -> None:
        """Queue ``env`` in a bounded mailbox, applying its overflow policy."""
        try:
            dropped = self.mailbox.offer(env)
        except MailboxFullError as full:  # the mailbox does not know whose it is
            raise MailboxFullError(f"{self.label}: {full}") from None
        if dropped is not None:
            self.dead_letter(dropped[0], dropped[1], "mailbox full")
            reply = dropped[2]
            if reply is not None and not reply.done():
                drop_ask(
                    reply, MailboxFullError(f"mailbox of {self.label} is full; message dropped")
                )
            if dropped is env:
                return
        self.wake()

    async def wait_for_room(self) -> None:
        """Wait for room if the mailbox is bounded with BACK_PRESSURE."""
        mailbox = self.mailbox
        if mailbox.policy is OverflowPolicy.BACK_PRESSURE:
            while self.accepting and mailbox.is_full:
                await mailbox.wait_for_room()

    def post_internal(self, message: Any) -> None:
        """Queue a runtime-made message (Terminated, ReceiveTimeout), ignoring capacity."""
        if self.accepting:
            self.queue.append((message, None, None))
            self.wake()
        else:
            self.dead_letter(message, None, "stopped")

    def post_tick(self, message: Any, timer: Cancellable) -> None:
        """Queue a timer's message; ``timer`` can take it back. A full bounded
        mailbox applies its policy, and where that would raise (FAIL,
        BACK_PRESSURE: a timer cannot wait) the tick is a dead letter."""
        if not self.accepting:
            self.dead_letter(message, None, "stopped")
        elif self.bounded:
            try:
                self.offer((message, None, None, timer))
            except MailboxFullError:
                self.dead_letter(message, None, "mailbox full")
        else:
            self.queue.append((message, None, None, timer))
            self.wake()

    def _take_out(self, match: Callable[[Envelope], bool]) -> list[Envelope]:
        """Remove the queued envelopes that ``match`` picks; on the loop thread.

        Other threads only ever append, so the positions found in the snapshot
        (``list`` of a deque is one C call) stay valid while they are deleted.
        """
        queue = self.queue
        found = [i for i, env in enumerate(list(queue)) if match(env)]
        taken = []
        for i in reversed(found):
            taken.append(queue[i])
            del queue[i]
            if self.mailbox.waiters:
                self.mailbox.wake_one()
        return taken

    def remove_ticks(self, match: Callable[[Cancellable], bool]) -> list[Cancellable]:
        """Take the queued messages of the timers ``match`` picks back out of the
        mailbox (a cancelled or replaced timer's message is never received).

        Returns:
            The timer of each message taken back.
        """
        taken = self._take_out(lambda env: len(env) == 4 and match(env[3]))
        return [env[3] for env in taken if len(env) == 4]

    def has_terminated(self, target: ActorCell) -> bool:
        """Whether a ``Terminated`` of ``target`` is queued (looked for in a
        snapshot, as ``_take_out`` does: other threads append meanwhile)."""
        return any(_is_terminated_of(env, target) for env in list(self.queue))

    def remove_terminated(self, target: ActorCell) -> None:
        """Discard a queued ``Terminated`` of ``target`` (``unwatch``, as in Akka)."""
        self._take_out(lambda env: _is_terminated_of(env, target))

    def remove_ask(self, reply: asyncio.Future[Any]) -> None:
        """Take the queued ask of ``reply`` back out of the mailbox, unhandled
        (``ActorRef.ask`` from a loop that the actor's cannot answer)."""
        self._take_out(lambda env: env[2] is reply)

    def post_system(self, item: tuple[str, Any]) -> None:
        """Queue a system message; it overtakes user messages."""
        if self.dead:
            return
        if self.sysq.__class__ is tuple:
            self.sysq = []
        self.sysq.append(item)  # type: ignore[union-attr]
        self.interrupt = True
        self.wake()

    def dead_letter(self, message: Any, sender: ActorRef | None, reason: str) -> None:
        """Publish an undelivered message on the system's dead letters."""
        self.system.dead_letters.publish(DeadLetter(message, sender, self.ref, reason))

    def request_stop(self) -> None:
        """Stop after the current message (an awaiting async handler is cancelled)."""
        if self.stop_requested:
            return
        self.stop_requested = True
        self.accepting = False
        self.interrupt = True
        self.mailbox.wake_all()
        self.wake()
        task = self.task
        if self.in_handler and task is not None:
            try:
                current = asyncio.current_task()
            except RuntimeError:
                current = None
            if current is not task:
                task.cancel()


def deliver_to_several(env: Envelope, cells: list[ActorCell]) -> None:
    """Queue ``env`` in each of ``cells`` (``forward`` to several; on their
    loop's thread), sharing its ask (``share_ask``): one that has stopped or
    whose full mailbox would refuse it is skipped (``deliver_shared``), and
    the ask fails only once every one that took it has dropped it (stopped
    before answering, or dropped it from a full mailbox).

    Raises:
        MailboxFullError: if none takes it and a full mailbox refused it (an
            ask then stays with the caller); if every one has stopped, the
            ask fails with ``ActorStoppedError`` instead.
    """
    reply = env[2]
    if reply is not None and reply.done():
        reply = None
    if reply is not None:
        share_ask(reply, len(cells) - 1)  # before queueing: a full mailbox may drop it
    lost = [cell.deliver_shared(env) for cell in cells]
    if None not in lost:
        if reply is not None:
            share_ask(reply, 1 - len(cells))  # held as before: by the caller
        if "mailbox full" in lost:
            raise MailboxFullError(f"every one of {len(cells)} actors refused the message")
        if reply is not None:
            drop_ask(
                reply, ActorStoppedError(f"all {len(cells)} actors it was forwarded to are stopped")
            )
        return
    if reply is not None:
        for cell, why in zip(cells, lost, strict=True):
            if why is not None:  # never held it
                drop_ask(
                    reply,
                    ActorStoppedError(f"{cell.label} is stopped")
                    if why == "stopped"
                    else MailboxFullError(f"mailbox of {cell.label} is full; message dropped"),
                )


def _is_terminated_of(env: Envelope, target: ActorCell) -> bool:
    """Whether the envelope holds the ``Terminated`` of ``target``."""
    return env[0].__class__ is Terminated and env[0].ref._cell is target
