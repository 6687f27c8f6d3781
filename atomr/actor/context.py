"""``Context``: what an actor can do about itself, its children and its timers."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Hashable
from threading import get_ident
from typing import TYPE_CHECKING, Any, TypeVar

from .errors import ActorStoppedError, bounded_repr
from .inbound import deliver_to_several
from .messages import Terminated
from .ref import ActorRef
from .reply import Reply
from .stopping import fail_late, unwatch
from .timers import Cancellable, check_delay

if TYPE_CHECKING:
    from .cell import ActorCell
    from .envelope import Envelope
    from .props import Props
    from .system import ActorSystem

__all__ = ["Context"]

T = TypeVar("T")


class Context:
    """An actor's view of the runtime (``self.context`` inside an actor)."""

    __slots__ = ("_cell",)

    def __init__(self, cell: ActorCell) -> None:
        self._cell = cell

    @property
    def self_ref(self) -> ActorRef:
        """This actor's ``ActorRef``."""
        return self._cell.ref

    @property
    def system(self) -> ActorSystem:
        """The ``ActorSystem`` this actor lives in."""
        return self._cell.system

    @property
    def sender(self) -> ActorRef | None:
        """Sender of the message being handled (None for asks and anonymous tells).

        In ``pre_restart`` and ``post_stop`` after a handler failed, the failed
        message's sender (as in Akka); None in any other hook.
        """
        env = self._cell.current
        return env[1] if env is not None else None

    @property
    def parent(self) -> ActorRef | None:
        """The parent's ref, or None for a top-level actor."""
        parent = self._cell.parent
        return parent.ref if parent is not None else None

    @property
    def children(self) -> list[ActorRef]:
        """Refs of the live children."""
        return [child.ref for child in self._cell.children.values()]

    def child(self, name: str) -> ActorRef | None:
        """The live child called ``name``, or None."""
        child = self._cell.children.get(name)
        return child.ref if child is not None else None

    def spawn(self, props: Props, name: str | None = None) -> ActorRef:
        """Start a child actor supervised by this one.

        Args:
            props: the child's ``Props``.
            name: unique among the siblings; None picks one.
        Returns:
            The child's ref, at once (it starts on the next loop turn).
        Raises:
            TypeError: if ``props`` is not a ``Props``.
            InvalidActorNameError, ActorNameTakenError: for a bad or taken name.
            ActorStoppedError: if this actor is stopping.
        """
        from .spawn import spawn_cell

        cell = self._cell
        _require_running(cell, "spawn children")
        return spawn_cell(cell.system, cell, cell, props, name, cell.path)

    def stop(self, ref: ActorRef) -> None:
        """Stop ``ref`` (this actor itself stops after the current message).

        Raises:
            TypeError: if ``ref`` is not an ``ActorRef``.
            RuntimeError: if ``ref`` lives on another thread's event loop
                (tell it ``PoisonPill()`` instead).
        """
        _require_local("stop", ref, "tell it PoisonPill() instead")
        ref._cell.request_stop()

    def watch(self, ref: ActorRef) -> ActorRef:
        """Get ``Terminated(ref)`` as a message when ``ref`` stops (at once if it has).

        Returns:
            ``ref``.
        Raises:
            TypeError: if ``ref`` is not an ``ActorRef``.
            RuntimeError: if ``ref`` lives on another thread's event loop
                (watching works within one loop).
            ActorStoppedError: if this actor is stopping (its ``Terminated``
                messages would be dead letters).
        """
        _require_local("watch", ref, "watching works within one loop")
        me = self._cell
        _require_running(me, "watch")
        target = ref._cell
        if target is me:
            return ref
        if target.dead:
            if not me.has_terminated(target):  # once, however often it is watched
                me.post_internal(Terminated(ref))
        else:
            if not target.watchers:
                target.watchers = set()
            if not me.watching:
                me.watching = set()
            target.watchers.add(me)  # type: ignore[union-attr]
            me.watching.add(target)  # type: ignore[union-attr]
        return ref

    def unwatch(self, ref: ActorRef) -> ActorRef:
        """Stop watching ``ref``; a ``Terminated(ref)`` already queued is discarded.

        As in Akka, one the actor received and stashed is its own while it
        stays stashed; ``unstash_all`` queues it again, and from then on
        ``unwatch`` discards it like any queued one. Returns ``ref``.

        Raises:
            TypeError: if ``ref`` is not an ``ActorRef``.
        """
        _require_ref("unwatch", ref)
        unwatch(self._cell, ref._cell)
        return ref

    def stash(self) -> None:
        """Put the message being handled aside until ``unstash_all()``.

        A stashed ask is answered when the message is handled again. A message
        is stashed at most once per handling (as in Akka). Stashed by code
        that outlived its stopped actor (a handler ``terminate`` gave up
        waiting for), it can never be handled again: it becomes a dead letter.

        Raises:
            RuntimeError: outside message handling, or if this message is
                already stashed.
        """
        cell = self._cell
        env = cell.current
        if env is None:
            raise RuntimeError("stash() must be called while handling a message")
        if env is cell.stashed_current:
            raise RuntimeError(
                f"stash(): {bounded_repr(env[0])} is already stashed; a message is stashed once"
            )
        if cell.stash.__class__ is tuple:
            cell.stash = []
        # a stashed tick is the actor's own: without its timer, no cancel or
        # new timer of the same key takes it back out once it is unstashed
        cell.stash.append(env[:3] if len(env) == 4 else env)  # type: ignore[union-attr]
        cell.current = cell.stashed_current = (env[0], env[1], None)
        if cell.dead:
            fail_late(cell)

    def unstash_all(self) -> int:
        """Put every stashed message back at the front of the mailbox, in order.

        A stopped actor has nothing stashed: its stash became dead letters
        when it stopped, and ``stash`` by code that outlived it (a handler
        or ``post_stop`` that ``terminate`` gave up waiting for) makes one
        at once, so nothing is queued where no loop will take it.

        Returns:
            How many messages were unstashed.
        """
        cell = self._cell
        count = len(cell.stash)
        if count:
            cell.queue.extendleft(reversed(cell.stash))
            cell.stash = ()
            cell.wake()
        return count

    def forward(self, *refs: ActorRef) -> None:
        """Pass the message being handled on to each of ``refs``, keeping its
        sender and its ask (the first of them to answer answers the asker; this
        handler's return value is ignored).

        One ref answers as it would a tell or ask: a stopped one fails the
        ask, and a bounded mailbox that refuses it raises here. Of several,
        one that has stopped or whose full mailbox drops or refuses the
        message is skipped, with a dead letter, and leaves the ask to the
        others: if every one has stopped the ask fails with
        ``ActorStoppedError``; if none takes it and a full mailbox refused it,
        ``MailboxFullError`` is raised and the ask stays with this handler.
        One that takes it and later drops it (stops before answering, or
        drops it from a full ``DROP_OLDEST`` mailbox) leaves it to the
        others too: the ask fails, with the last one's error, only when
        every one that took it has dropped it. An answer (a ``Failure``, an
        exception its handler raised) answers it at once.

        Raises:
            RuntimeError: outside message handling.
            TypeError: without any ref, or with something that is not an ``ActorRef``.
            RuntimeError: if a ref lives on another thread's event loop (ask
                it and return the answer instead).
            MailboxFullError: if every ref's bounded mailbox refuses the message.
        """
        cell = self._cell
        env = cell.current
        if env is None:
            raise RuntimeError("forward() must be called while handling a message")
        if not refs:
            raise TypeError("forward() needs at least one ActorRef")
        for ref in refs:
            _require_local("forward", ref, "ask it and return the answer instead")
        if len(refs) == 1:
            refs[0]._cell.deliver(env)
        else:
            deliver_to_several(env, [ref._cell for ref in refs])
        _take_reply(cell, env)

    def defer(self) -> Reply:
        """Answer the current ask later: returns a ``Reply`` to complete.

        The handler's return value is then ignored and the actor takes its
        next message while the reply is still out. If the actor stops first,
        the asker gets ``ActorStoppedError`` (unless other actors it was
        forwarded to still hold the ask: see ``forward``).

        Raises:
            RuntimeError: outside message handling.
        """
        cell = self._cell
        env = cell.current
        if env is None:
            raise RuntimeError("defer() must be called while handling a message")
        fut = env[2]
        _take_reply(cell, env)
        reply = Reply(fut, cell if fut is not None else None)
        if fut is not None:
            if not cell.replies:
                cell.replies = set()
            cell.replies.add(reply)  # type: ignore[union-attr]
        return reply

    def create_task(self, coro: Coroutine[Any, Any, T], name: str | None = None) -> asyncio.Task[T]:
        """Run ``coro`` as a task tied to this actor.

        The task is cancelled when the actor stops or restarts; an exception
        escaping it fails the actor like a handler exception (supervision).

        Raises:
            TypeError: if ``coro`` is not a coroutine.
            ActorStoppedError: if this actor is stopping.
        """
        if not asyncio.iscoroutine(coro):
            raise TypeError(f"create_task expects a coroutine, got {type(coro).__name__}")
        cell = self._cell
        try:
            _require_running(cell, "create tasks")
        except ActorStoppedError:
            coro.close()  # never to run: no "never awaited" warning
            raise
        return cell.create_task(coro, name)

    def schedule_once(self, delay: float, message: Any, key: Hashable | None = None) -> Cancellable:
        """Tell ``message`` to this actor after ``delay`` seconds.

        A cancelled or replaced timer's message is never received, even if it
        was already queued (as in Akka, one the actor received and stashed is
        its own); timers are cancelled on stop and restart.

        Args:
            delay: seconds (>= 0).
            message: what to send.
            key: a live timer of this actor with the same key is replaced.
        Returns:
            A handle with ``cancel()``.
        Raises:
            ValueError, TypeError: for a negative or non-numeric delay, or an
                unhashable key.
            ActorStoppedError: if this actor is stopping (its timers are
                cancelled; a tick would be a dead letter).
        """
        cell = self._cell
        _require_running(cell, "start timers")
        return cell.timer_set().schedule(cell.scheduler, cell, message, delay, key=key)

    def schedule_repeatedly(
        self,
        interval: float,
        message: Any,
        initial_delay: float | None = None,
        key: Hashable | None = None,
    ) -> Cancellable:
        """Tell ``message`` to this actor every ``interval`` seconds.

        Args:
            interval: seconds between messages (> 0).
            message: what to send.
            initial_delay: seconds before the first one (default ``interval``).
            key: a live timer of this actor with the same key is replaced.
        Returns:
            A handle with ``cancel()`` (see ``schedule_once``).
        Raises:
            ValueError, TypeError: for bad interval or delay, or an unhashable key.
            ActorStoppedError: if this actor is stopping (see ``schedule_once``).
        """
        cell = self._cell
        _require_running(cell, "start timers")
        delay = interval if initial_delay is None else initial_delay
        return cell.timer_set().schedule(cell.scheduler, cell, message, delay, interval, key)

    def cancel_timer(self, key: Hashable) -> bool:
        """Cancel this actor's live timer started with ``key`` (its queued message
        is taken back).

        Returns:
            False if there is no such timer.
        """
        cell = self._cell
        timers = cell.timers
        return timers is not None and timers.cancel(key, cell)

    @property
    def receive_timeout(self) -> float | None:
        """The current receive timeout in seconds, or None."""
        return self._cell.receive_timeout

    def set_receive_timeout(self, seconds: float | None) -> None:
        """Get ``ReceiveTimeout()`` after ``seconds`` without any message (None: off).

        Raises:
            ValueError, TypeError: for a value that is not a number > 0 or None.
        """
        if seconds is not None:
            seconds = check_delay("receive timeout", seconds, allow_zero=False)
        self._cell.receive_timeout = seconds

    def __repr__(self) -> str:
        return f"<Context of {self._cell.path}>"


def _take_reply(cell: ActorCell, env: Envelope) -> None:
    """The current message's ask was passed on (``forward``, ``defer``): the
    handler's return value answers nothing now. A message already stashed
    stays known as stashed, so that it is not stashed twice."""
    current = (env[0], env[1], None)
    if cell.stashed_current is env:
        cell.stashed_current = current
    cell.current = current


def _require_running(cell: ActorCell, what: str) -> None:
    """The one rule for what starts something new for an actor (children,
    tasks, timers, watches): refused once it is stopping, since a stop
    would never end it, or what it brings would only be dead letters.

    Raises:
        ActorStoppedError: if the actor is stopping or has stopped.
    """
    if not cell.accepting:
        raise ActorStoppedError(f"{cell.path} is stopping; cannot {what}")


def _require_local(method: str, ref: object, instead: str) -> None:
    """``ref`` is an ``ActorRef`` on this thread's loop (what ``method`` reaches
    into directly, without the thread hop a tell or ask makes)."""
    _require_ref(method, ref)
    target = ref._cell  # type: ignore[attr-defined]
    if target.thread_id != get_ident():
        raise RuntimeError(
            f"{method}() of {target.label}: it lives on another thread's event loop; {instead}"
        )


def _require_ref(method: str, ref: object) -> None:
    if not isinstance(ref, ActorRef):
        raise TypeError(
            f"{method}() takes an ActorRef, got {type(ref).__name__}: {bounded_repr(ref)}"
        )
