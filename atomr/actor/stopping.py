"""Stopping an actor: its children first, then ``post_stop``; what still
waits on it fails, its watchers get ``Terminated``. Also what the mailbox
loop does when a handler is cancelled or lets a ``BaseException`` escape.
Internal."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from .empty import NONE
from .errors import ActorStoppedError, bounded_repr
from .messages import PoisonPill, Terminated
from .reply import drop_ask, drop_deferred

if TYPE_CHECKING:
    from .cell import ActorCell
    from .envelope import Envelope

__all__ = [
    "cancel_tasks",
    "died",
    "discard",
    "ended_from_outside",
    "fail_late",
    "fail_pending",
    "fail_queued",
    "in_post_stop",
    "maybe_await",
    "shutdown",
    "stop_children",
    "stopped_in_handler",
    "unwatch_all",
    "waits_for_caller",
    "why_stopped",
]

logger = logging.getLogger("atomr.actor")

_CANCELLED_FROM_OUTSIDE = (
    "its task was cancelled from outside, without a stop: its event loop shut down "
    "(asyncio.run or a test's loop ending) or code cancelled every task"
)
"""Why an actor stopped whose task was cancelled by someone else than its
system (``ActorCell.ended_by``); its askers are told."""

_CANCELLED_FROM_INSIDE = "CancelledError escaped its own code (it awaited something cancelled)"
"""Why, when its own code raised ``CancelledError`` while nobody cancelled its task."""


def why_stopped(cell: ActorCell) -> str:
    """``"; <why>"`` for an actor stopped by something else than a stop
    request (``ActorCell.ended_by``), else "": the tail of its errors."""
    return f"; {cell.ended_by}" if cell.ended_by is not None else ""


_IN_POST_STOP: ContextVar[bool] = ContextVar("atomr_in_post_stop", default=False)
"""Whether the running task is in an actor's ``post_stop``."""


async def maybe_await(value: Any) -> None:
    """Await ``value`` if it is awaitable (a hook may be plain or async)."""
    if inspect.isawaitable(value):
        await value


def discard(cell: ActorCell, reason: str) -> None:
    """Drop ``cell`` and its children without running any more of their
    code: its construction (or its parent's) failed, or ``terminate`` gave
    up waiting for it. Messages told to it become dead letters; its asks
    and deferred replies fail with ``ActorStoppedError(reason)``.
    """
    tree = [cell]  # a loop, not recursion: a tree may be deeper than the stack
    while tree:
        dropped = tree.pop()
        tree.extend(dropped.children.values())
        dropped.children.clear()
        _discard_one(dropped, reason)


def _discard_one(cell: ActorCell, reason: str) -> None:
    cell.accepting = False
    cell.stop_requested = True
    cell.interrupt = True  # a handler that outlives it returns to a loop that ends
    if cell.task is not None:
        cell.task.cancel()  # before its first step _run never starts; a stuck one is left
    for task in cell.tasks:
        task.cancel()
    if cell.timers is not None:
        cell.timers.cancel_all()
    _end(cell, ActorStoppedError(f"{cell.label} {reason}"))


def _end(cell: ActorCell, stopped: ActorStoppedError) -> None:
    """The actor is gone: the ask it was answering and everything pending
    fail with `stopped`, it watches nothing, its watchers get `Terminated`
    but for stopping ones (as in Akka: a parent watching the children that
    stop before it would only make dead letters of them)."""
    cell.dead = True
    current = cell.current
    if current is not None:  # the loop died in the handler, or was abandoned there
        # an abandoned handler that returns later finds no ask to answer
        cell.current = (current[0], current[1], None)
        if current[2] is not None and not current[2].done():
            drop_ask(current[2], stopped)
    fail_pending(cell, stopped)
    unwatch_all(cell)
    terminated = Terminated(cell.ref)
    for watcher in list(cell.watchers):
        watcher.watching.discard(cell)  # type: ignore[union-attr]
        if watcher.accepting:
            watcher.post_internal(terminated)
    cell.watchers = NONE
    cell.mark_stopped()
    cell.release()


def waits_for_caller(cell: ActorCell) -> bool:
    """Whether stopping `cell` waits for the running task: the task of
    `cell` itself or of one of its descendants (a handler or ``post_stop``
    awaiting its own stop, or an ancestor's, would wait for itself)."""
    try:
        caller = asyncio.current_task()
    except RuntimeError:  # no running loop
        return False
    if caller is None:
        return False
    tree = [cell]
    while tree:
        node = tree.pop()
        if node.task is caller:
            return True
        tree.extend(node.children.values())
    return False


async def cancel_tasks(cell: ActorCell) -> None:
    """Cancel the actor's tasks (not the calling one) and wait for them."""
    tasks = [t for t in cell.tasks if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks)


async def stop_children(cell: ActorCell) -> None:
    """Stop every child and wait until they have stopped."""
    children = list(cell.children.values())
    for child in children:
        child.request_stop()
    tasks = [c.task for c in children if c.task is not None]
    if tasks:
        await asyncio.wait(tasks)


async def shutdown(cell: ActorCell) -> None:
    """The end of the actor's task: tasks and children stopped, ``post_stop``
    (if it started), pending asks failed, watchers told ``Terminated``.
    Nothing is left to do for an actor ``discard`` dropped meanwhile."""
    if cell.has_stopped:
        return
    cell.stop_requested = True
    cell.accepting = False
    task = cell.task
    if task is not None:
        while task.cancelling():
            task.uncancel()
    if cell.timers is not None:
        cell.timers.cancel_all()
    cell.receive_timeout = None
    await cancel_tasks(cell)
    await stop_children(cell)
    escaped = await _post_stop(cell)
    if cell.has_stopped:
        return
    cell.supervisor.child_stopped(cell)
    _end(cell, ActorStoppedError(f"{cell.label} stopped before answering{why_stopped(cell)}"))
    cell.current = None
    if escaped is not None:
        raise escaped  # only now: the actor has ended in every respect


async def _post_stop(cell: ActorCell) -> BaseException | None:
    """Run ``post_stop`` (if the actor started). What it raises is logged and
    the actor ends all the same; a ``KeyboardInterrupt``, ``SystemExit`` or
    ``CancelledError`` is returned, for ``shutdown`` to raise once the actor
    has ended (its watchers told, its stop awaited), as a handler's would be."""
    if not cell.started:
        return None
    stopping = _IN_POST_STOP.set(True)
    try:
        await maybe_await(cell.instance.post_stop())
    except Exception:
        logger.exception("post_stop of %s failed", cell.label)
    except BaseException as error:
        if cell.has_stopped:  # abandoned by terminate, which logged it
            return None
        logger.critical(
            "post_stop of %s raised %s", cell.label, bounded_repr(error), exc_info=error
        )
        if isinstance(error, KeyboardInterrupt | SystemExit | asyncio.CancelledError):
            return error
    finally:
        _IN_POST_STOP.reset(stopping)
    return None


def in_post_stop() -> bool:
    """Whether the running code is an actor's ``post_stop`` (which an
    awaited ``ActorSystem.terminate`` would wait for)."""
    return _IN_POST_STOP.get()


def fail_pending(cell: ActorCell, stopped: ActorStoppedError) -> None:
    """Fail what still waits on the dead ``cell``: queued and stashed messages
    become dead letters (a PoisonPill is no loss), their asks and deferred
    replies get `stopped`, senders blocked on a full mailbox are woken.

    A thread whose ``tell`` read the actor as accepting just before it
    stopped may queue its message after this: it then finds the waiter set
    here (done, never cleared again) and has the loop dead-letter it
    (``threads.wake_from_thread``), so no message is lost in between.
    """
    stopped_waiter: asyncio.Future[None] = cell.loop.create_future()
    stopped_waiter.set_result(None)
    cell.waiter = stopped_waiter  # before the queue is emptied
    stash = cell.stash
    cell.stash = ()
    fail_queued(cell, stopped)
    _fail(cell, stash, stopped)
    cell.sysq = ()
    drop_deferred(cell.replies, stopped)
    cell.replies = NONE
    if cell.ask_lanes is not None:
        for lane in cell.ask_lanes.values():
            lane.close()
        cell.ask_lanes = None
    cell.mailbox.wake_all()


def fail_queued(cell: ActorCell, stopped: ActorStoppedError) -> None:
    """Dead-letter the messages queued for the dead ``cell`` (their asks get
    `stopped`). Taken one at a time, not copied then cleared: a message that
    another thread appends meanwhile is taken here or left for the next
    call, never cleared unseen."""
    queue = cell.queue
    pending = []
    while queue:
        pending.append(queue.popleft())
    _fail(cell, pending, stopped)


def fail_late(cell: ActorCell) -> None:
    """Dead-letter what is queued or stashed for the dead ``cell`` (their
    asks get ``ActorStoppedError``): told from another thread as it stopped
    (``threads``), or stashed by code that outlived it (a handler or
    ``post_stop`` that ``terminate`` gave up waiting for). Nothing handles
    them any more, so none is lost unseen."""
    stopped = ActorStoppedError(f"{cell.label} stopped{why_stopped(cell)}")
    stash = cell.stash
    cell.stash = ()
    fail_queued(cell, stopped)
    _fail(cell, stash, stopped)


def _fail(cell: ActorCell, pending: Iterable[Envelope], stopped: ActorStoppedError) -> None:
    for env in pending:
        if env[0].__class__ is not PoisonPill:
            cell.dead_letter(env[0], env[1], "stopped")
        if env[2] is not None:
            drop_ask(env[2], stopped)


def unwatch(cell: ActorCell, target: ActorCell) -> None:
    """``cell`` stops watching ``target``; a ``Terminated`` of it already
    queued is discarded (as in Akka)."""
    if target in cell.watching:
        target.watchers.discard(cell)  # type: ignore[union-attr]
        cell.watching.discard(target)  # type: ignore[union-attr]
    cell.remove_terminated(target)


def unwatch_all(cell: ActorCell) -> None:
    """Stop watching every actor this one watches."""
    for target in cell.watching:
        target.watchers.discard(cell)  # type: ignore[union-attr]
    cell.watching = NONE


def died(cell: ActorCell, error: BaseException) -> None:
    """A ``BaseException`` escaped a handler or hook of ``cell``: log it; the
    loop then stops the actor.

    It is not an ``Exception``, so supervision does not handle it (as in
    Akka for fatal errors); the ask being answered gets ``ActorStoppedError``.
    """
    logger.critical(
        "%s stopped: %s escaped its handler", cell.label, bounded_repr(error), exc_info=error
    )
    current = cell.current
    if current is not None and current[2] is not None:
        cell.current = (current[0], current[1], None)  # dropped once: not by `_end` again
        stopped = ActorStoppedError(f"{cell.label} stopped: {type(error).__name__} escaped")
        drop_ask(current[2], stopped)


def ended_from_outside(cell: ActorCell, ending: BaseException) -> None:
    """The actor's task was ended by something else than its system.

    Cancelled (``CancelledError``) without a stop request: its loop is
    shutting down, or code cancelled every task; ``ended_by`` keeps why, for
    its askers (or that its own code raised it, nobody cancelling its task).
    Closed unfinished (``GeneratorExit``): its loop closed, or was dropped,
    before the system was terminated, and the task was garbage collected.
    Nothing can run on that loop any more, so nothing is awaited or answered
    (waking a child or an asker would fail with "Event loop is closed"): the
    actor only stops taking messages, its ``post_stop`` does not run, and
    one warning says why.
    """
    if not isinstance(ending, GeneratorExit):
        if not cell.stop_requested:
            task = cell.task
            own = task is not None and not task.cancelling()  # nobody cancelled it
            cell.ended_by = _CANCELLED_FROM_INSIDE if own else _CANCELLED_FROM_OUTSIDE
        return
    cell.accepting = False
    cell.stop_requested = True
    cell.has_stopped = True
    logger.warning(
        "%s was discarded unfinished: its event loop closed before its ActorSystem was "
        "terminated (post_stop did not run); terminate the system, or leave its "
        "'async with', before closing the loop",
        cell.label,
    )


async def run_start_hook(cell: ActorCell, call: Callable[[], Any], hook: str, what: str) -> bool:
    """Run a starting hook: `call()` (the first `pre_start`, or a new
    instance's `post_restart`); an async one runs as a handler, so that a
    stop cancels it.

    Args:
        cell: the actor's cell.
        call: builds what the hook returns (raising as the hook raises).
        hook: the hook's name, for `stopped_in_handler`.
        what: what failed, for the log ("pre_start", "restart").

    Returns:
        Whether it finished: False when it raised (logged: the actor stops)
        or a stop cancelled it.
    """
    try:
        started = call()
        if started is not None:  # an async hook's coroutine: a stop cancels it
            cell.in_handler = True
            try:
                await maybe_await(started)
            finally:
                cell.in_handler = False
    except Exception:
        logger.exception("%s of %s failed; stopping it", what, cell.label)
        return False
    except asyncio.CancelledError:
        if stopped_in_handler(cell, None, hook):
            return False
        raise
    return True


def stopped_in_handler(cell: ActorCell, message: Any, hook: str = "receive") -> bool:
    """A handler of ``cell`` (or an async hook named by ``hook``:
    ``pre_start``, ``pre_restart``, ``post_restart``) was cancelled. True
    when the actor's stop cancelled it: the ask it was answering gets
    ``ActorStoppedError``. False otherwise, after logging a handler that
    let a ``CancelledError`` of its own escape (the loop then re-raises it
    and the actor stops)."""
    task = cell.task
    if cell.stop_requested and task is not None and task.cancelling():
        reply = cell.current[2] if cell.current is not None else None
        cell.current = None
        task.uncancel()
        if reply is not None and not reply.done():
            drop_ask(
                reply,
                ActorStoppedError(f"{cell.label} stopped while handling {bounded_repr(message)}"),
            )
        return True
    if task is not None and not task.cancelling():
        logger.error(
            "%s of %s let CancelledError escape on %s; stopping it",
            hook,
            cell.label,
            bounded_repr(message),
        )
    return False
