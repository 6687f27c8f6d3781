"""``ActorCell``: the runtime engine behind one actor (its state, its mailbox
loop, stopping). Internal; users see ``ActorRef`` and ``Context``. What comes
in is in ``inbound``, handling a failure in ``supervise``, creating a cell in
``spawn``, reaching one from another thread in ``threads``.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import weakref
from collections import deque
from collections.abc import Coroutine
from types import CoroutineType
from typing import TYPE_CHECKING, Any

from . import actor as _actor_module
from .actor import Actor
from .ask_deadlines import AskDeadlines
from .context import Context
from .empty import NONE
from .envelope import Envelope
from .inbound import Inbound
from .mailbox import DEFAULT_MAILBOX, Mailbox
from .messages import PoisonPill, ReceiveTimeout
from .props import Props
from .ref import ActorRef
from .reply import Failure, Reply, delivered
from .stopping import (
    died,
    discard,
    ended_from_outside,
    run_start_hook,
    shutdown,
    stopped_in_handler,
)
from .supervise import decide, drop_system, failed, process_system, strategy_of, task_died
from .supervision import Directive, SupervisorStrategy
from .timers import Scheduler, TimerSet

if TYPE_CHECKING:
    from .supervise import Supervisor
    from .system import ActorSystem

__all__ = ["ActorCell"]


THROUGHPUT = 1024
"""Messages an actor handles before yielding the loop to others."""

_sleep0 = asyncio.sleep

_ASYNC_RECEIVE: dict[type, bool] = {}
"""Whether an actor class's ``receive`` is a coroutine function (asked once per class)."""


def _idle(message: Any) -> Any:
    """Stands in for ``receive`` while an actor waits (never called)."""
    raise AssertionError("an idle actor's receive was called")


class ActorCell(Inbound):
    """Mailbox, instance, lifecycle and children of one actor (what comes in:
    ``Inbound``, inbound.py)."""

    # slots: an idle actor is mostly this object, and a __dict__ would add 1.8 KB
    __slots__ = (
        "accepting", "ask_lanes", "bounded", "children", "class_name", "context",
        "current", "dead", "ended_by", "in_handler", "instance", "interrupt", "loop", "mailbox",
        "name", "parent", "path", "props", "queue", "receive_async",
        "receive_timeout", "_ref", "_ref_weak", "replies", "restart_times", "scheduler", "started",
        "stash", "stashed_current", "stop_requested", "_stopped", "has_stopped", "strategy",
        "supervisor", "suspended", "sysq", "system", "task", "tasks", "thread_id",
        "timers", "waiter", "wake_pending", "watchers", "watching",
    )  # fmt: skip

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
        self.loop: asyncio.AbstractEventLoop = system._running_loop()
        self.scheduler: Scheduler = system.scheduler
        self.thread_id = threading.get_ident()
        self.props = props
        self.name = name
        self.path = path
        self.class_name = props.class_name
        self.parent = parent
        self.supervisor = supervisor
        if props.mailbox is None:  # one shared settings object, and a queue of its own
            self.mailbox: Mailbox = DEFAULT_MAILBOX
            self.queue: deque[Envelope] = deque()
        else:
            self.mailbox = props.mailbox.copy()
            self.queue = self.mailbox.queue
        self.bounded = self.mailbox.capacity is not None
        # containers most actors never fill start as shared empty immutables and
        # are made on first use: fewer objects per actor for the cyclic collector
        self.sysq: list[tuple[str, Any]] | tuple[()] = ()
        self.waiter: asyncio.Future[None] | None = None
        self.wake_pending = False
        self.accepting = True
        self.stop_requested = False
        self.dead = False
        self.ended_by: str | None = None  # why it stopped, when no stop was asked
        self.started = False
        self.suspended = False
        self.interrupt = False
        self.in_handler = False
        self.children: dict[str, ActorCell] = {}
        self.watchers: set[ActorCell] | frozenset[ActorCell] = NONE
        self.watching: set[ActorCell] | frozenset[ActorCell] = NONE
        self.stash: list[Envelope] | tuple[()] = ()
        self.stashed_current: Envelope | None = None  # what stash() left as current
        self.current: Envelope | None = None
        self.replies: set[Reply] | frozenset[Reply] = NONE
        self.ask_lanes: dict[float, AskDeadlines] | None = None  # made by the first timed ask
        self.tasks: set[asyncio.Task[Any]] | frozenset[asyncio.Task[Any]] = NONE
        self.timers: TimerSet | None = None  # made by the first timer (`timer_set`)
        self.receive_timeout: float | None = None
        self.restart_times: list[float] | tuple[()] = ()
        self.strategy: SupervisorStrategy | None = None
        self._ref: ActorRef | None = ActorRef(self)
        self._ref_weak: weakref.ref[ActorRef] | None = None
        self.context = Context(self)
        self._stopped: asyncio.Future[None] | None = None  # made when first awaited
        self.has_stopped = False
        self.task: asyncio.Task[None] | None = None
        try:
            self.instance: Actor = self.new_instance()
        except BaseException:
            discard(self, "failed to start")
            raise

    # ------------------------------------------------------------------ setup
    def new_instance(self) -> Actor:
        """Build the actor from its Props (on spawn and on every restart)."""
        creating = _actor_module._creating
        outer = creating.context
        creating.context = self.context  # taken by the first Actor.__new__
        try:
            instance = self.props.create()
        finally:
            creating.context = outer
        _actor_module.bind_context(instance, self.context)
        self._bind(instance)
        return instance

    def _bind(self, instance: Actor) -> None:
        self.instance = instance
        self.class_name = type(instance).__name__
        if "receive" in getattr(instance, "__dict__", ()):  # this instance's own receive
            self.receive_async = inspect.iscoroutinefunction(instance.receive)
        else:
            receive_async = _ASYNC_RECEIVE.get(type(instance))
            if receive_async is None:
                receive_async = inspect.iscoroutinefunction(instance.receive)
                _ASYNC_RECEIVE[type(instance)] = receive_async
            self.receive_async = receive_async
        self.strategy = None

    def start(self) -> None:
        """Schedule the actor's loop on the event loop."""
        self.task = self.loop.create_task(self._run(), name=f"atomr {self.path}")

    def timer_set(self) -> TimerSet:
        """The actor's timers, made on the first one (most actors never start one)."""
        timers = self.timers
        if timers is None:
            timers = self.timers = TimerSet()
        return timers

    @property
    def ref(self) -> ActorRef:
        """The actor's ``ActorRef``: held strongly while it lives, weakly once it
        is dead (``release``), so that a dead cell is freed by reference counting
        alone; whoever still holds the ref gets that same ref back."""
        ref = self._ref
        if ref is None:
            ref = self._ref_weak() if self._ref_weak is not None else None
            if ref is None:
                ref = ActorRef(self)
                self._ref_weak = weakref.ref(ref)
        return ref

    def release(self) -> None:
        """Break the reference cycles of a dead cell (its ref, context and
        instance point back at it), so that it is freed without the cyclic
        garbage collector, whose passes over many live actors are costly."""
        if self._ref is not None:
            self._ref_weak = weakref.ref(self._ref)
            self._ref = None
        for name in ("instance", "context"):
            if hasattr(self, name):
                delattr(self, name)

    @property
    def stopped(self) -> asyncio.Future[None]:
        """A future done once the actor has fully stopped."""
        fut = self._stopped
        if fut is None:
            fut = self._stopped = self.loop.create_future()
            if self.has_stopped:
                fut.set_result(None)
        return fut

    def mark_stopped(self) -> None:
        """The actor has fully stopped: resolve ``stopped``."""
        self.has_stopped = True
        fut = self._stopped
        if fut is not None and not fut.done():
            fut.set_result(None)

    @property
    def label(self) -> str:
        """The actor's path and class, as error texts name it."""
        return f"{self.path} ({self.class_name})"

    def create_task(self, coro: Coroutine[Any, Any, Any], name: str | None) -> asyncio.Task[Any]:
        """Start a task owned by this actor (see ``Context.create_task``)."""
        task = self.loop.create_task(coro, name=name)
        if not self.tasks:
            self.tasks = set()
        self.tasks.add(task)  # type: ignore[union-attr]
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        if task in self.tasks:
            self.tasks.discard(task)  # type: ignore[union-attr]
        if task.cancelled():
            return
        error = task.exception()
        if error is None:
            return
        if isinstance(error, Exception) and not self.stop_requested:
            self.post_system(("task failed", (error, self.instance)))
        else:
            task_died(self, error)

    # -------------------------------------------------------------- the loop
    async def _run(self) -> None:
        try:
            if not await self._start():
                return
            await self._loop()
        except (asyncio.CancelledError, GeneratorExit) as ending:
            ended_from_outside(self, ending)
            raise
        except BaseException as error:
            died(self, error)
            if isinstance(error, KeyboardInterrupt | SystemExit):
                raise  # asyncio stops the loop with it, as Python would
        finally:
            drop_system(self)
            await shutdown(self)

    async def _start(self) -> bool:
        if not await run_start_hook(self, self.instance.pre_start, "pre_start", "pre_start"):
            return False
        self.started = True
        return True

    async def _loop(self) -> None:
        loop = self.loop
        queue = self.queue
        room_waiters = self.mailbox.waiters
        while True:
            if self.interrupt:
                self.interrupt = False
                if self.stop_requested:
                    return
                if self.sysq:
                    await process_system(self)
                    self.interrupt = True
                    continue
            if not queue or self.suspended:
                # inline, not a method: every ask round trip passes here (4 % of an ask)
                # an idle actor keeps no bound method, nor its last message,
                # answer or ask (a batch, weights): stores here, not per message
                receive = _idle
                env = message = result = reply = None
                self.stashed_current = None
                waiter = loop.create_future()
                self.waiter = waiter
                if queue and not self.suspended:
                    self.waiter = None  # told from another thread meanwhile
                    continue
                timeout = self.receive_timeout
                handle = None
                if timeout is not None and not self.suspended:
                    handle = self.scheduler.call_later(timeout, self._receive_timed_out)
                # whoever wakes it clears self.waiter first; a cancelled wait
                # leaves it (a stop replaces it: stopping.fail_pending)
                try:
                    await waiter
                finally:
                    if handle is not None:
                        handle.cancel()
                continue
            receive = self.instance.receive
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
                    if env[2] is not None:  # asked: failed with the queue once stopped
                        queue.appendleft(env)
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
                        if result.__class__ is CoroutineType:  # awaited, as a hook's would be
                            self.in_handler = True
                            try:
                                result = await result
                            finally:
                                self.in_handler = False
                except Exception as error:
                    await failed(self, error)
                    if self.stop_requested:
                        return  # post_stop still sees the failed message's sender
                    break
                except asyncio.CancelledError:
                    if stopped_in_handler(self, message):
                        break
                    raise  # shutdown fails the current ask
                reply = self.current[2]
                if reply is not None and not reply.done():
                    if result.__class__ is Failure:
                        reply.set_exception(delivered(result.exception, False))
                    else:
                        reply.set_result(result)
                if self.interrupt:
                    break
            self.current = None
            if n == 0 and queue and not self.interrupt:
                await _sleep0(0)

    def _receive_timed_out(self) -> None:
        if self.receive_timeout is not None and not self.queue:
            self.post_internal(ReceiveTimeout())

    # ----------------------------------------------------------- supervision
    def decide_for(
        self, child: ActorCell, error: BaseException
    ) -> tuple[Directive, SupervisorStrategy | None]:
        """Decide what to do with a failed child (as its parent)."""
        if self.stop_requested:
            return Directive.STOP, None
        strategy = self.strategy or strategy_of(self)
        if strategy is None:  # this actor's bug, not the child's: as a decider that raises
            return Directive.ESCALATE, None
        self.strategy = strategy
        return decide(strategy, child, error), strategy

    def escalate(self, child: ActorCell, error: BaseException) -> None:
        """A child escalated: fail this actor with the same error."""
        self.post_system(("failed", (error, self.instance)))

    def child_stopped(self, child: ActorCell) -> None:
        """Forget a child that has stopped."""
        if self.children.get(child.name) is child:
            del self.children[child.name]

    def __repr__(self) -> str:
        return f"<ActorCell {self.path}>"
