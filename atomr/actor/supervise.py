"""How a cell handles a failure: the supervisor decides, then resume, restart,
stop or escalate (Akka's fault handling). Internal."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Protocol

from .empty import NONE
from .errors import bounded_repr
from .reply import delivered, fail_deferred
from .stopping import (
    cancel_tasks,
    maybe_await,
    run_start_hook,
    stop_children,
    stopped_in_handler,
    unwatch,
)
from .supervision import Directive, SupervisorStrategy

if TYPE_CHECKING:
    from .cell import ActorCell

__all__ = [
    "Supervisor",
    "decide",
    "drop_system",
    "failed",
    "handle_failure",
    "process_system",
    "restart",
    "resume",
    "strategy_of",
    "task_died",
]

logger = logging.getLogger("atomr.actor")


class Supervisor(Protocol):
    """What a cell needs from whoever supervises it (a parent cell or the guardian)."""

    children: dict[str, ActorCell]

    def decide_for(
        self, child: ActorCell, error: BaseException
    ) -> tuple[Directive, SupervisorStrategy | None]: ...

    def escalate(self, child: ActorCell, error: BaseException) -> None: ...

    def child_stopped(self, child: ActorCell) -> None: ...


def strategy_of(cell: ActorCell) -> SupervisorStrategy | None:
    """The strategy ``cell`` supervises its children with: its `Props`' or its
    actor's ``supervisor_strategy()``; None (the parent escalates, as for a
    decider that raises) when that raises or returns something else, logged."""
    try:
        strategy = cell.props.supervisor_strategy or cell.instance.supervisor_strategy()
    except Exception:
        logger.exception("supervisor_strategy() of %s failed; escalating", cell.label)
        return None
    if not isinstance(strategy, SupervisorStrategy):
        logger.error(
            "supervisor_strategy() of %s returned %s, not a SupervisorStrategy; escalating",
            cell.label,
            bounded_repr(strategy),
        )
        return None
    return strategy


def decide(strategy: SupervisorStrategy, child: ActorCell, error: BaseException) -> Directive:
    """Apply ``strategy`` to ``child``'s failure, turning RESTART into STOP past the window."""
    try:
        directive = strategy.directive_for(child.ref, error)
    except Exception:
        logger.exception("supervisor decider failed for %s; escalating", child.label)
        return Directive.ESCALATE
    if directive is Directive.RESTART and not _may_restart(strategy, child):
        logger.warning("%s exceeded %s; stopping it", child.label, strategy)
        return Directive.STOP
    return directive


def _may_restart(strategy: SupervisorStrategy, child: ActorCell) -> bool:
    """Whether ``strategy`` allows restarting ``child`` once more, recording
    the restart. An all-for-one restart restarts every child of the
    supervisor, so it counts for each of them (as in Akka): one of them past
    ``max_restarts`` within ``within`` refuses it."""
    now = child.scheduler.time()
    cells = [child]
    if strategy.applies_to_all:
        cells += [c for c in child.supervisor.children.values() if c is not child]
    for cell in cells:
        if cell.restart_times.__class__ is tuple:
            cell.restart_times = []
        if not strategy.allows_restart(cell.restart_times, now):  # type: ignore[arg-type]
            return False
    return True


async def failed(cell: ActorCell, error: Exception) -> None:
    """The handler raised: answer its ask with ``error`` (marked: `actor_failed`),
    then supervision.

    The message and its sender stay current (without the ask), so
    ``context.sender`` works in ``pre_restart`` and ``post_stop``, as in Akka.
    """
    current = cell.current
    assert current is not None
    reply = current[2]
    cell.current = (current[0], current[1], None)
    if reply is not None and not reply.done():
        reply.set_exception(delivered(error, True))
    await handle_failure(cell, error, current[0])


async def process_system(cell: ActorCell) -> None:
    """Handle the queued system messages (failed task, restart, resume)."""
    sysq = cell.sysq
    while sysq and not cell.stop_requested:
        kind, arg = sysq.pop(0)
        if kind == "failed" or kind == "task failed":
            error, instance = arg
            if instance is cell.instance:
                await handle_failure(cell, error, None)
            elif kind == "task failed":  # as in Akka, not supervised; but lost: said
                task_died(cell, error, " as its instance was replaced (not supervised)")
            else:  # an escalation to an earlier incarnation: its restart stopped the child
                logger.debug("%s: dropped a failure of its previous instance", cell.label)
        elif kind == "restart":
            await restart(cell, arg, None)
        elif kind == "resume":
            resume(cell)


def task_died(cell: ActorCell, error: BaseException, when: str = "") -> None:
    """Log the failure of a task of ``cell`` that no supervisor handles: one
    that ended as the actor stopped (or with a ``BaseException``), or as it
    restarted (``when``); lost, it is an ERROR all the same."""
    logger.error("task of %s died with %s%s", cell.label, bounded_repr(error), when, exc_info=error)


def drop_system(cell: ActorCell) -> None:
    """The actor stops: its queued system messages are never handled. The
    failures of its tasks among them are lost: logged (`task_died`)."""
    for kind, arg in cell.sysq:
        if kind == "task failed":
            task_died(cell, arg[0], " as its actor stopped (not supervised)")


def resume(cell: ActorCell) -> None:
    """Go on with the same instance (and resume the children an escalation suspended)."""
    cell.suspended = False
    cell.interrupt = True
    for child in cell.children.values():
        if child.suspended:
            child.post_system(("resume", None))


async def handle_failure(cell: ActorCell, error: Exception, message: Any) -> None:
    """Log the failure, ask the supervisor, and carry out its directive."""
    logger.warning(
        "%s failed on %s: %s",
        cell.label,
        bounded_repr(message),
        bounded_repr(error),
        exc_info=error,
    )
    if cell.stop_requested:
        return
    supervisor = cell.supervisor
    directive, strategy = supervisor.decide_for(cell, error)
    all_children = strategy is not None and strategy.applies_to_all
    if directive is Directive.RESUME:
        resume(cell)
    elif directive is Directive.RESTART:
        if all_children:
            for sibling in list(supervisor.children.values()):
                if sibling is not cell:
                    sibling.post_system(("restart", error))
        await restart(cell, error, message)
    elif directive is Directive.STOP:
        if all_children:
            for sibling in list(supervisor.children.values()):
                sibling.request_stop()
        cell.request_stop()
    else:
        cell.suspended = True
        cell.interrupt = True
        supervisor.escalate(cell, error)


async def restart(cell: ActorCell, error: BaseException, message: Any) -> None:
    """Replace the instance by a new one from Props (Akka's restart): timers,
    tasks, children and deferred replies of the old one go; the mailbox and
    the stash stay. A stop that comes while it waits (for the old tasks,
    children or ``pre_restart``) ends it there: no new instance is built
    only to be stopped."""
    if cell.stop_requested:
        return
    old = cell.instance
    if cell.timers is not None:  # and the queued messages of this incarnation's timers
        cell.timers.cancel_all(cell)
    cell.receive_timeout = None
    await cancel_tasks(cell)
    # as Akka's default pre_restart: the old instance's children go unwatched,
    # so the new instance gets no Terminated for children it never had
    for child in cell.children.values():
        unwatch(cell, child)
    await stop_children(cell)
    if cell.stop_requested:  # stopped meanwhile: it ends as any stop does (post_stop)
        return
    # deferred replies belonged to the discarded instance: fail them now
    # (with the error that caused the restart, marked as one that failed the
    # actor: `actor_failed`) instead of leaving the askers to hang until
    # their timeouts
    fail_deferred(cell.replies, error, True)
    cell.replies = NONE
    try:
        await maybe_await(old.pre_restart(error, message))
    except Exception:
        logger.exception("pre_restart of %s failed", cell.label)
    except asyncio.CancelledError:  # its own (logged, the actor stops) or a stop's
        if not stopped_in_handler(cell, message, "pre_restart"):
            raise
    if cell.stop_requested:  # stopped during pre_restart, which cleaned up: no post_stop
        cell.started = False
        return
    if cell.stash:
        cell.queue.extendleft(reversed(cell.stash))
        cell.stash = ()
    if not await _start_new_instance(cell, error):
        # pre_restart already cleaned up the old instance and the new one did
        # not start (as when pre_start fails): no post_stop
        cell.started = False
        cell.request_stop()
        return
    cell.suspended = False
    cell.interrupt = True


async def _start_new_instance(cell: ActorCell, error: BaseException) -> bool:
    """Build the new instance from Props and run its ``post_restart``
    (`run_start_hook`: as the first ``pre_start``, a stop cancels an async
    one). Returns whether it started."""

    def post_restart() -> Any:
        return cell.new_instance().post_restart(error)

    return await run_start_hook(cell, post_restart, "post_restart", "restart")
