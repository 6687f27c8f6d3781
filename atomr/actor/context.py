"""``Context``: what an actor can do about itself, its children and its timers."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from .errors import ActorStoppedError
from .messages import Terminated
from .ref import ActorRef
from .reply import Reply
from .timers import Cancellable, _check_delay

if TYPE_CHECKING:
    from .cell import ActorCell
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
        """Sender of the message being handled (None for asks and anonymous tells)."""
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
        from .cell import spawn_cell

        cell = self._cell
        if not cell.accepting:
            raise ActorStoppedError(f"{cell.path} is stopping; cannot spawn children")
        return spawn_cell(cell.system, cell, cell, props, name, cell.path)

    def stop(self, ref: ActorRef) -> None:
        """Stop ``ref`` (this actor itself stops after the current message).

        Raises:
            TypeError: if ``ref`` is not an ``ActorRef``.
        """
        _require_ref("stop", ref)
        ref._cell.request_stop()

    def watch(self, ref: ActorRef) -> ActorRef:
        """Get ``Terminated(ref)`` as a message when ``ref`` stops (at once if it has).

        Returns:
            ``ref``.
        Raises:
            TypeError: if ``ref`` is not an ``ActorRef``.
        """
        _require_ref("watch", ref)
        me = self._cell
        target = ref._cell
        if target is me:
            return ref
        if target.dead:
            me.post_internal(Terminated(ref))
        else:
            target.watchers.add(me)
            me.watching.add(target)
        return ref

    def unwatch(self, ref: ActorRef) -> ActorRef:
        """Stop watching ``ref``. Returns ``ref``.

        Raises:
            TypeError: if ``ref`` is not an ``ActorRef``.
        """
        _require_ref("unwatch", ref)
        target = ref._cell
        target.watchers.discard(self._cell)
        self._cell.watching.discard(target)
        return ref

    def stash(self) -> None:
        """Put the message being handled aside until ``unstash_all()``.

        A stashed ask is answered when the message is handled again.

        Raises:
            RuntimeError: outside message handling.
        """
        cell = self._cell
        env = cell.current
        if env is None:
            raise RuntimeError("stash() must be called while handling a message")
        cell.stash.append(env)
        cell.current = (env[0], env[1], None)

    def unstash_all(self) -> int:
        """Put every stashed message back at the front of the mailbox, in order.

        Returns:
            How many messages were unstashed.
        """
        cell = self._cell
        count = len(cell.stash)
        if count:
            cell.queue.extendleft(reversed(cell.stash))
            cell.stash.clear()
            cell.wake()
        return count

    def forward(self, *refs: ActorRef) -> None:
        """Pass the message being handled on to each of ``refs``, keeping its
        sender and its ask (the first of them to answer answers the asker; this
        handler's return value is ignored).

        If a delivery raises (a full ``FAIL`` mailbox), the ask stays with this
        handler, so the asker gets the error.

        Raises:
            RuntimeError: outside message handling.
            TypeError: without any ref, or with something that is not an ``ActorRef``.
            MailboxFullError: if a bounded mailbox refuses the message.
        """
        cell = self._cell
        env = cell.current
        if env is None:
            raise RuntimeError("forward() must be called while handling a message")
        if not refs:
            raise TypeError("forward() needs at least one ActorRef")
        for ref in refs:
            _require_ref("forward", ref)
        for ref in refs:
            ref._cell.deliver(env)
        cell.current = (env[0], env[1], None)

    def defer(self) -> Reply:
        """Answer the current ask later: returns a ``Reply`` to complete.

        The handler's return value is then ignored and the actor takes its
        next message while the reply is still out. If the actor stops first,
        the asker gets ``ActorStoppedError``.

        Raises:
            RuntimeError: outside message handling.
        """
        cell = self._cell
        env = cell.current
        if env is None:
            raise RuntimeError("defer() must be called while handling a message")
        fut = env[2]
        cell.current = (env[0], env[1], None)
        reply = Reply(fut, cell if fut is not None else None)
        if fut is not None:
            cell.replies.add(reply)
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
        if not cell.accepting:
            coro.close()
            raise ActorStoppedError(f"{cell.path} is stopping; cannot create tasks")
        return cell.create_task(coro, name)

    def schedule_once(self, delay: float, message: Any) -> Cancellable:
        """Tell ``message`` to this actor after ``delay`` seconds.

        Returns:
            A handle with ``cancel()``; timers are cancelled on stop and restart.
        Raises:
            ValueError, TypeError: for a negative or non-numeric delay.
        """
        cell = self._cell
        return cell.timers.schedule_once(cell.loop, delay, lambda: cell.post_internal(message))

    def schedule_repeatedly(
        self, interval: float, message: Any, initial_delay: float | None = None
    ) -> Cancellable:
        """Tell ``message`` to this actor every ``interval`` seconds.

        Args:
            interval: seconds between messages (> 0).
            message: what to send.
            initial_delay: seconds before the first one (default ``interval``).
        Returns:
            A handle with ``cancel()``; timers are cancelled on stop and restart.
        Raises:
            ValueError, TypeError: for bad interval or delay.
        """
        cell = self._cell
        return cell.timers.schedule_repeatedly(
            cell.loop, interval, lambda: cell.post_internal(message), initial_delay
        )

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
            seconds = _check_delay("receive timeout", seconds, allow_zero=False)
        self._cell.receive_timeout = seconds

    def __repr__(self) -> str:
        return f"<Context of {self._cell.path}>"


def _require_ref(method: str, ref: object) -> None:
    if not isinstance(ref, ActorRef):
        raise TypeError(f"{method}() takes an ActorRef, got {type(ref).__name__}: {ref!r}")
