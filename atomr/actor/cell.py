"""``ActorCell``: the runtime engine behind one actor (mailbox loop, lifecycle,
supervision of its children). Internal; users see ``ActorRef`` and ``Context``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from collections import deque
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from . import actor as _actor_module
from .actor import Actor
from .context import Context
from .envelope import Envelope
from .errors import (
    ActorNameTakenError,
    ActorStoppedError,
    InvalidActorNameError,
    MailboxFullError,
    bounded_repr,
)
from .mailbox import Mailbox, OverflowPolicy
from .messages import DeadLetter, PoisonPill, ReceiveTimeout, Terminated
from .props import Props
from .ref import ActorRef
from .reply import Failure, Reply
from .supervision import Directive, SupervisorStrategy
from .timers import Cancellable, Scheduler, TimerSet

if TYPE_CHECKING:
    from .system import ActorSystem

__all__ = ["ActorCell", "Supervisor", "spawn_cell"]

logger = logging.getLogger("atomr.actor")

THROUGHPUT = 1024
"""Messages an actor handles before yielding the loop to others."""

_sleep0 = asyncio.sleep


class Supervisor(Protocol):
    """What a cell needs from whoever supervises it (a parent cell or the guardian)."""

    children: dict[str, ActorCell]

    def decide_for(
        self, child: ActorCell, error: BaseException
    ) -> tuple[Directive, SupervisorStrategy | None]: ...

    def escalate(self, child: ActorCell, error: BaseException) -> None: ...

    def child_stopped(self, child: ActorCell) -> None: ...


async def _maybe_await(value: Any) -> None:
    if inspect.isawaitable(value):
        await value


def decide(strategy: SupervisorStrategy, child: ActorCell, error: BaseException) -> Directive:
    """Apply ``strategy`` to ``child``'s failure, turning RESTART into STOP past the window."""
    try:
        directive = strategy.directive_for(child.ref, error)
    except Exception:
        logger.exception("supervisor decider failed for %s; escalating", child.label)
        return Directive.ESCALATE
    if directive is Directive.RESTART and not strategy.allows_restart(
        child.restart_times, child.scheduler.time()
    ):
        logger.warning("%s exceeded %s; stopping it", child.label, strategy)
        return Directive.STOP
    return directive


def _check_name(name: Any) -> str:
    if not isinstance(name, str):
        raise InvalidActorNameError(f"actor name must be a str, got {type(name).__name__}")
    if not name or "/" in name or name.startswith("$") or name != name.strip():
        raise InvalidActorNameError(
            f"invalid actor name {name!r}: non-empty, no '/', no surrounding spaces, "
            "no leading '$' (reserved for generated names)"
        )
    return name


def spawn_cell(
    system: ActorSystem,
    supervisor: Supervisor,
    parent: ActorCell | None,
    props: Props,
    name: str | None,
    base_path: str,
) -> ActorRef:
    """Create, register and start an actor; returns its ref at once.

    Raises:
        TypeError: if ``props`` is not ``Props``.
        InvalidActorNameError, ActorNameTakenError: for a bad or taken name.
    """
    if not isinstance(props, Props):
        hint = ""
        if isinstance(props, type) and issubclass(props, Actor):
            hint = f"; wrap the class: Props({props.__name__})"
        raise TypeError(f"spawn expects Props, got {type(props).__name__}{hint}")
    if name is None:
        system._name_counter += 1
        name = f"${system._name_counter}"
    else:
        _check_name(name)
    if name in supervisor.children:
        raise ActorNameTakenError(f"an actor named {name!r} already exists under {base_path}")
    path = f"{base_path}/{name}"
    try:
        cell = ActorCell(system, props, name, path, parent, supervisor)
    except Exception as error:
        error.add_note(f"raised while creating {path} ({props.class_name})")
        raise
    supervisor.children[name] = cell
    cell.start()
    return cell.ref


class ActorCell:
    """Mailbox, instance, lifecycle and children of one actor."""

    def __init__(
        self,
        system: ActorSystem,
        props: Props,
        name: str,
        path: str,
        parent: ActorCell | None,
        supervisor: Supervisor,
    ) -> None:
        self.system = system
        self.loop: asyncio.AbstractEventLoop = system.loop
        self.scheduler: Scheduler = system.scheduler
        self.thread_id = threading.get_ident()
        self.props = props
        self.name = name
        self.path = path
        self.class_name = props.class_name
        self.parent = parent
        self.supervisor = supervisor
        mailbox = props.mailbox.copy() if props.mailbox is not None else Mailbox()
        self.mailbox = mailbox
        self.queue: deque[Envelope] = mailbox.queue
        self.bounded = mailbox.capacity is not None
        self.sysq: deque[tuple[str, Any]] = deque()
        self.waiter: asyncio.Future[None] | None = None
        self.wake_pending = False
        self.accepting = True
        self.stop_requested = False
        self.dead = False
        self.started = False
        self.suspended = False
        self.interrupt = False
        self.in_handler = False
        self.children: dict[str, ActorCell] = {}
        self.watchers: set[ActorCell] = set()
        self.watching: set[ActorCell] = set()
        self.stash: deque[Envelope] = deque()
        self.stashed_current: Envelope | None = None  # what stash() left as current
        self.current: Envelope | None = None
        self.replies: set[Reply] = set()
        self.tasks: set[asyncio.Task[Any]] = set()
        self.timers = TimerSet()
        self.receive_timeout: float | None = None
        self.restart_times: deque[float] = deque()
        self.strategy: SupervisorStrategy | None = None
        self.ref = ActorRef(self)
        self.context = Context(self)
        self.stopped: asyncio.Future[None] = self.loop.create_future()
        self.task: asyncio.Task[None] | None = None
        try:
            self.instance: Actor = self._new_instance()
        except BaseException:
            self.discard("failed to start")
            raise

    # ------------------------------------------------------------------ setup
    def _new_instance(self) -> Actor:
        creating = _actor_module._creating
        outer = creating[0]
        creating[0] = self.context  # taken by the first Actor.__new__
        try:
            instance = self.props.create()
        finally:
            creating[0] = outer
        instance._context = self.context
        self._bind(instance)
        return instance

    def _bind(self, instance: Actor) -> None:
        self.instance = instance
        self.class_name = type(instance).__name__
        self.receive_fn = instance.receive
        self.receive_async = inspect.iscoroutinefunction(instance.receive)
        self.strategy = None

    def start(self) -> None:
        """Schedule the actor's loop on the event loop."""
        self.task = self.loop.create_task(self._run(), name=f"atomr {self.path}")

    @property
    def label(self) -> str:
        """The actor's path and class, as error texts name it."""
        return f"{self.path} ({self.class_name})"

    def discard(self, reason: str) -> None:
        """Drop this cell and its children without running any more of their
        code: its construction (or its parent's) failed, or ``terminate`` gave
        up waiting for it. Messages told to it become dead letters; its asks
        and deferred replies fail with ``ActorStoppedError(reason)``.
        """
        self.accepting = False
        self.stop_requested = True
        self.dead = True
        if self.task is not None:
            self.task.cancel()  # before its first step: _run never starts
        for task in self.tasks:
            task.cancel()
        self.timers.cancel_all()
        for child in list(self.children.values()):
            child.discard(reason)
        self.children.clear()
        self._fail_pending(ActorStoppedError(f"{self.label} {reason}"))
        self._unwatch_all()
        if not self.stopped.done():
            self.stopped.set_result(None)

    # ---------------------------------------------------------------- inbound
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
                reply.set_exception(ActorStoppedError(f"{self.label} is stopped"))
            return
        if self.bounded:
            self.offer(env)
            return
        self.queue.append(env)
        self.wake()

    def offer(self, env: Envelope) -> None:
        """Queue ``env`` in a bounded mailbox, applying its overflow policy."""
        dropped = self.mailbox.offer(env)
        if dropped is not None:
            self.dead_letter(dropped[0], dropped[1], "mailbox full")
            reply = dropped[2]
            if reply is not None and not reply.done():
                reply.set_exception(
                    MailboxFullError(f"mailbox of {self.label} is full; message dropped")
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
        """Queue a timer's message, ignoring capacity; ``timer`` can take it back."""
        if self.accepting:
            self.queue.append((message, None, None, timer))
            self.wake()
        else:
            self.dead_letter(message, None, "stopped")

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

    def remove_terminated(self, target: ActorCell) -> None:
        """Discard a queued ``Terminated`` of ``target`` (``unwatch``, as in Akka)."""
        self._take_out(lambda env: env[0].__class__ is Terminated and env[0].ref._cell is target)

    # --------------------------------------------------------- other threads
    def call_threadsafe(self, callback: Callable[..., object], *args: Any) -> None:
        """Run ``callback(*args)`` on this actor's loop, from any thread.

        Raises:
            ActorStoppedError: if that loop is closed.
        """
        try:
            self.loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the loop is closed
            raise ActorStoppedError(f"{self.label}: its event loop is closed") from None

    def wake_threadsafe(self) -> None:
        """Wake the idle actor from another thread (one wake-up for a burst of tells)."""
        if not self.wake_pending:
            self.wake_pending = True
            self.call_threadsafe(self._wake_from_thread)

    def _wake_from_thread(self) -> None:
        self.wake_pending = False
        self.wake()

    def deliver_from_thread(self, env: Envelope) -> None:
        """``tell`` from another thread to a bounded or stopped actor: delivered on
        the loop; a refusal of a full mailbox becomes a dead letter there.

        Raises:
            ActorStoppedError: if the actor's loop is closed.
        """
        self.call_threadsafe(self._deliver_told, env)

    def _deliver_told(self, env: Envelope) -> None:
        try:
            self.deliver(env)
        except MailboxFullError:
            self.dead_letter(env[0], env[1], "mailbox full")

    def post_system(self, item: tuple[str, Any]) -> None:
        """Queue a system message; it overtakes user messages."""
        if self.dead:
            return
        self.sysq.append(item)
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

    def create_task(self, coro: Coroutine[Any, Any, Any], name: str | None) -> asyncio.Task[Any]:
        """Start a task owned by this actor (see ``Context.create_task``)."""
        task = self.loop.create_task(coro, name=name)
        self.tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if error is None:
            return
        if isinstance(error, Exception) and not self.stop_requested:
            self.post_system(("failed", error))
        else:
            logger.error("task of %s died with %s", self.label, bounded_repr(error), exc_info=error)

    # -------------------------------------------------------------- the loop
    async def _run(self) -> None:
        try:
            if not await self._start():
                return
            await self._loop()
        except asyncio.CancelledError:
            raise
        except BaseException as error:
            self._died(error)
            if isinstance(error, KeyboardInterrupt | SystemExit):
                raise  # asyncio stops the loop with it, as Python would
        finally:
            await self._shutdown()

    def _died(self, error: BaseException) -> None:
        """A ``BaseException`` escaped a handler or hook: log it and stop.

        It is not an ``Exception``, so supervision does not handle it (as in
        Akka for fatal errors); the ask being answered gets ``ActorStoppedError``.
        """
        logger.critical(
            "%s stopped: %s escaped its handler", self.label, bounded_repr(error), exc_info=error
        )
        current = self.current
        if current is not None and current[2] is not None and not current[2].done():
            stopped = ActorStoppedError(f"{self.label} stopped: {type(error).__name__} escaped")
            current[2].set_exception(stopped)

    async def _start(self) -> bool:
        try:
            await _maybe_await(self.instance.pre_start())
        except Exception:
            logger.exception("pre_start of %s failed; stopping it", self.label)
            return False
        self.started = True
        return True

    async def _loop(self) -> None:
        loop = self.loop
        queue = self.queue
        sysq = self.sysq
        room_waiters = self.mailbox.waiters
        while True:
            if self.interrupt:
                self.interrupt = False
                if self.stop_requested:
                    return
                if sysq:
                    await self._process_system()
                    self.interrupt = True
                    continue
            if not queue or self.suspended:
                waiter = loop.create_future()
                self.waiter = waiter
                if queue and not self.suspended:
                    self.waiter = None  # told from another thread meanwhile
                    continue
                timeout = self.receive_timeout
                handle = None
                if timeout is not None and not self.suspended:
                    handle = self.scheduler.call_later(timeout, self._receive_timed_out)
                try:
                    await waiter
                finally:
                    self.waiter = None
                    if handle is not None:
                        handle.cancel()
                continue
            receive = self.receive_fn
            is_async = self.receive_async
            n = len(queue)
            if n > THROUGHPUT:
                n = THROUGHPUT
            while n:
                n -= 1
                env = queue.popleft()
                if room_waiters:
                    self.mailbox.wake_one()
                message = env[0]
                if message.__class__ is PoisonPill:
                    self.request_stop()
                    break
                self.current = env
                try:
                    if is_async:
                        self.in_handler = True
                        try:
                            result = await receive(message)
                        finally:
                            self.in_handler = False
                    else:
                        result = receive(message)
                except Exception as error:
                    await self._failed(error)
                    if self.stop_requested:
                        return  # post_stop still sees the failed message's sender
                    break
                except asyncio.CancelledError:
                    task = self.task
                    if self.stop_requested and task is not None and task.cancelling():
                        reply = self.current[2]
                        self.current = None
                        task.uncancel()
                        if reply is not None and not reply.done():
                            reply.set_exception(
                                ActorStoppedError(
                                    f"{self.label} stopped while handling {bounded_repr(message)}"
                                )
                            )
                        break
                    if task is not None and not task.cancelling():
                        logger.error(
                            "receive of %s let CancelledError escape on %s; stopping it",
                            self.label,
                            bounded_repr(message),
                        )
                    raise  # _shutdown fails the current ask
                reply = self.current[2]
                if reply is not None and not reply.done():
                    if result.__class__ is Failure:
                        reply.set_exception(result.exception)
                    else:
                        reply.set_result(result)
                if self.interrupt:
                    break
            self.current = None
            if n == 0 and queue and not self.interrupt:
                await _sleep0(0)

    async def _failed(self, error: Exception) -> None:
        """The handler raised: answer its ask with ``error``, then supervision.

        The message and its sender stay current (without the ask), so
        ``context.sender`` works in ``pre_restart`` and ``post_stop``, as in Akka.
        """
        current = self.current
        assert current is not None
        reply = current[2]
        self.current = (current[0], current[1], None)
        if reply is not None and not reply.done():
            reply.set_exception(error)
        await self._handle_failure(error, current[0])

    def _receive_timed_out(self) -> None:
        if self.receive_timeout is not None and not self.queue:
            self.post_internal(ReceiveTimeout())

    async def _process_system(self) -> None:
        sysq = self.sysq
        while sysq and not self.stop_requested:
            kind, arg = sysq.popleft()
            if kind == "failed":
                await self._handle_failure(arg, None)
            elif kind == "restart":
                await self._restart(arg, None)
            elif kind == "resume":
                self._resume()

    # ----------------------------------------------------------- supervision
    def decide_for(
        self, child: ActorCell, error: BaseException
    ) -> tuple[Directive, SupervisorStrategy | None]:
        """Decide what to do with a failed child (as its parent)."""
        if self.stop_requested:
            return Directive.STOP, None
        strategy = self.strategy
        if strategy is None:
            strategy = self.props.supervisor_strategy or self.instance.supervisor_strategy()
            self.strategy = strategy
        return decide(strategy, child, error), strategy

    def escalate(self, child: ActorCell, error: BaseException) -> None:
        """A child escalated: fail this actor with the same error."""
        self.post_system(("failed", error))

    def child_stopped(self, child: ActorCell) -> None:
        """Forget a child that has stopped."""
        if self.children.get(child.name) is child:
            del self.children[child.name]

    def _resume(self) -> None:
        self.suspended = False
        self.interrupt = True
        for child in self.children.values():
            if child.suspended:
                child.post_system(("resume", None))

    async def _handle_failure(self, error: Exception, message: Any) -> None:
        logger.warning(
            "%s failed on %s: %s",
            self.label,
            bounded_repr(message),
            bounded_repr(error),
            exc_info=error,
        )
        if self.stop_requested:
            return
        supervisor = self.supervisor
        directive, strategy = supervisor.decide_for(self, error)
        all_children = strategy is not None and strategy.applies_to_all
        if directive is Directive.RESUME:
            self._resume()
        elif directive is Directive.RESTART:
            if all_children:
                for sibling in list(supervisor.children.values()):
                    if sibling is not self:
                        sibling.post_system(("restart", error))
            await self._restart(error, message)
        elif directive is Directive.STOP:
            if all_children:
                for sibling in list(supervisor.children.values()):
                    sibling.request_stop()
            self.request_stop()
        else:
            self.suspended = True
            self.interrupt = True
            supervisor.escalate(self, error)

    async def _restart(self, error: BaseException, message: Any) -> None:
        if self.stop_requested:
            return
        old = self.instance
        self.timers.cancel_all(self)  # and the queued messages of this incarnation's timers
        self.receive_timeout = None
        await self._cancel_tasks()
        await self._stop_children()
        # deferred replies belonged to the discarded instance: fail them now
        # (with the error that caused the restart) instead of leaving the
        # askers to hang until their timeouts
        for deferred in list(self.replies):
            deferred.set_exception(error)
        self.replies.clear()
        try:
            await _maybe_await(old.pre_restart(error, message))
        except Exception:
            logger.exception("pre_restart of %s failed", self.label)
        if self.stash:
            self.queue.extendleft(reversed(self.stash))
            self.stash.clear()
        try:
            instance = self._new_instance()
            await _maybe_await(instance.post_restart(error))
        except Exception:
            logger.exception("restart of %s failed; stopping it", self.label)
            # pre_restart already cleaned up the old instance and the new one did
            # not start (as when pre_start fails): no post_stop
            self.started = False
            self.request_stop()
            return
        self.suspended = False
        self.interrupt = True

    # -------------------------------------------------------------- stopping
    async def _cancel_tasks(self) -> None:
        tasks = [t for t in self.tasks if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    async def _stop_children(self) -> None:
        children = list(self.children.values())
        for child in children:
            child.request_stop()
        tasks = [c.task for c in children if c.task is not None]
        if tasks:
            await asyncio.wait(tasks)

    async def _shutdown(self) -> None:
        self.stop_requested = True
        self.accepting = False
        task = self.task
        if task is not None:
            while task.cancelling():
                task.uncancel()
        self.timers.cancel_all()
        self.receive_timeout = None
        await self._cancel_tasks()
        await self._stop_children()
        if self.started:
            try:
                await _maybe_await(self.instance.post_stop())
            except Exception:
                logger.exception("post_stop of %s failed", self.label)
        self.dead = True
        stopped = ActorStoppedError(f"{self.label} stopped before answering")
        current = self.current
        self.current = None
        if current is not None and current[2] is not None and not current[2].done():
            current[2].set_exception(stopped)  # the loop died in the handler
        self._fail_pending(stopped)
        self.supervisor.child_stopped(self)
        self._unwatch_all()
        terminated = Terminated(self.ref)
        for watcher in list(self.watchers):
            watcher.watching.discard(self)
            watcher.post_internal(terminated)
        self.watchers.clear()
        if not self.stopped.done():
            self.stopped.set_result(None)

    def _fail_pending(self, stopped: ActorStoppedError) -> None:
        """Fail what still waits on this dead actor: queued and stashed messages
        become dead letters (a PoisonPill is no loss), their asks and deferred
        replies get `stopped`, senders blocked on a full mailbox are woken."""
        for queue in (self.queue, self.stash):
            while queue:
                env = queue.popleft()
                if env[0].__class__ is not PoisonPill:
                    self.dead_letter(env[0], env[1], "stopped")
                reply = env[2]
                if reply is not None and not reply.done():
                    reply.set_exception(stopped)
        self.sysq.clear()
        for deferred in list(self.replies):
            deferred.set_exception(stopped)
        self.replies.clear()
        self.mailbox.wake_all()

    def _unwatch_all(self) -> None:
        """Stop watching every actor this one watches."""
        for target in self.watching:
            target.watchers.discard(self)
        self.watching.clear()

    def __repr__(self) -> str:
        return f"<ActorCell {self.path}>"
