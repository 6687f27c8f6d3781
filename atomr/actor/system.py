"""``ActorSystem``: owns the top-level actors, dead letters and shutdown."""

from __future__ import annotations

import asyncio
import logging
from types import TracebackType
from typing import Any

from .cell import ActorCell
from .context import _require_local
from .dead_letters import DeadLetters
from .errors import bounded_repr
from .props import Props
from .ref import ActorRef, check_timeout
from .spawn import check_name, spawn_cell
from .stopping import discard, in_post_stop
from .supervise import decide
from .supervision import Directive, OneForOneStrategy, SupervisorStrategy
from .threads import idle_loop_error
from .timers import Cancellable, Scheduler, TimerSet

__all__ = ["DEFAULT_TERMINATE_TIMEOUT", "ActorSystem"]

logger = logging.getLogger("atomr.actor")

DEFAULT_TERMINATE_TIMEOUT = 60.0
"""Seconds ``terminate()`` (and leaving ``async with``) waits for actors to stop."""


class _Guardian:
    """Supervisor of the top-level actors (Akka's user guardian)."""

    def __init__(self, system: ActorSystem, strategy: SupervisorStrategy) -> None:
        self.system = system
        self.strategy = strategy
        self.children: dict[str, ActorCell] = {}

    def decide_for(
        self, child: ActorCell, error: BaseException
    ) -> tuple[Directive, SupervisorStrategy | None]:
        if self.system._terminating:
            return Directive.STOP, None
        return decide(self.strategy, child, error), self.strategy

    def escalate(self, child: ActorCell, error: BaseException) -> None:
        logger.error(
            "%s escalated %s to the guardian; stopping it", child.label, bounded_repr(error)
        )
        child.request_stop()

    def child_stopped(self, child: ActorCell) -> None:
        if self.children.get(child.name) is child:
            del self.children[child.name]


class ActorSystem:
    """A tree of actors on one event loop.

    Use ``async with ActorSystem("name") as system:``; leaving the block
    terminates it. The system binds to the running loop on first use.

    Args:
        name: the system's name (first element of actor paths).
        guardian_strategy: how failed top-level actors are supervised
            (default: restart, as in Akka).
        scheduler: the clock of timers, receive timeouts and supervision's
            restart windows (default: the event loop; a test passes
            ``atomr.testkit.ManualClock()``). Ask timeouts use the loop.
        terminate_timeout: seconds leaving ``async with`` waits for the
            actors to stop (``terminate(timeout=...)``); None: no deadline.
    Raises:
        ValueError: for a bad terminate_timeout, or a name that is not a path
            element as an actor's name is (``InvalidActorNameError``: empty,
            with '/', a control character, ...; a leading '$' is allowed).
        TypeError: for a non-string name, a bad strategy or a bad scheduler.
    """

    def __init__(
        self,
        name: str = "atomr",
        *,
        guardian_strategy: SupervisorStrategy | None = None,
        scheduler: Scheduler | None = None,
        terminate_timeout: float | None = DEFAULT_TERMINATE_TIMEOUT,
    ) -> None:
        if not isinstance(name, str):
            raise TypeError(f"system name must be a str, got {type(name).__name__}")
        check_name(name, "system name", leading_dollar=True)  # every path's first element
        if guardian_strategy is not None and not isinstance(guardian_strategy, SupervisorStrategy):
            raise TypeError("guardian_strategy must be a SupervisorStrategy")
        if scheduler is not None and not (
            callable(getattr(scheduler, "call_later", None))
            and callable(getattr(scheduler, "time", None))
        ):
            raise TypeError("scheduler must have call_later(delay, callback, *args) and time()")
        check_timeout(terminate_timeout)
        self.name = name
        self.terminate_timeout = terminate_timeout
        self._scheduler = scheduler
        self.dead_letters = DeadLetters()
        self._guardian = _Guardian(self, guardian_strategy or OneForOneStrategy())
        self._loop: asyncio.AbstractEventLoop | None = None
        self._name_counter = 0
        self._terminating = False
        self._terminated: asyncio.Task[None] | None = None
        self._timers = TimerSet()
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the system runs on, from any thread: hand it to
        ``asyncio.run_coroutine_threadsafe`` or ``loop.call_soon_threadsafe``.
        A system not yet used binds to the running loop here.

        Raises:
            RuntimeError: if the system is not bound to a loop yet (or its
                loop closed with no actor left) and none runs here.
        """
        loop = self._loop
        if loop is not None and not self._may_rebind(loop):
            return loop
        return self._running_loop()

    def _may_rebind(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Whether the system may move to another loop: its own is closed
        and no actor is left on it (``asyncio.run`` cancelled them all)."""
        return loop.is_closed() and not self._guardian.children

    _no_loop_advice = "use it inside a coroutine (e.g. atomr.run(main()))"
    """What the error of a use with no running loop advises (atomr's pytest
    plugin gives the systems of its fixtures their own: an async test)."""

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        """The system's loop, which must be the one running here (what only
        that loop may do: spawn, terminate, timers); binds on first use.

        Raises:
            RuntimeError: if used without a running loop, or from another loop.
        """
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            if self._loop is not None and self._loop.is_running():
                raise RuntimeError(self._elsewhere()) from None
            raise RuntimeError(
                f"ActorSystem needs a running event loop: {self._no_loop_advice}"
            ) from None
        if self._loop is None or self._may_rebind(self._loop):
            self._loop = running
        elif running is not self._loop:
            raise RuntimeError(self._elsewhere())
        return self._loop

    def _elsewhere(self) -> str:
        """Why the caller's loop may not do what only the system's may."""
        loop = self._loop
        if loop is not None and loop.is_closed():
            return (
                f"ActorSystem {self.name!r}: its event loop closed before it was terminated, "
                f"so its {len(self._guardian.children)} top-level actor(s) can never run "
                "again; start a new ActorSystem on this loop"
            )
        if loop is not None and not loop.is_running():
            return idle_loop_error(f"ActorSystem {self.name!r}")
        return (
            f"ActorSystem {self.name!r} runs on another event loop (another thread): call "
            "this there, e.g. with asyncio.run_coroutine_threadsafe or "
            "loop.call_soon_threadsafe; ActorRef.tell / ask / send work from anywhere"
        )

    @property
    def scheduler(self) -> Scheduler:
        """The clock of timers and receive timeouts (the loop unless one was given).

        Raises:
            RuntimeError: as ``loop`` does, when it is the loop.
        """
        return self._scheduler if self._scheduler is not None else self._running_loop()

    @property
    def is_terminated(self) -> bool:
        """True once ``terminate()`` has started."""
        return self._terminating

    def spawn(self, props: Props, name: str | None = None) -> ActorRef:
        """Start a top-level actor and return its ref at once.

        Args:
            props: the actor's ``Props``.
            name: unique among top-level actors; None picks one.
        Returns:
            The actor's ``ActorRef`` (the actor starts on the next loop turn).
        Raises:
            TypeError: if ``props`` is not a ``Props``.
            InvalidActorNameError, ActorNameTakenError: for a bad or taken name.
            RuntimeError: without a running loop, or once terminated.
        """
        self._running_loop()
        if self._terminating:
            raise RuntimeError(f"ActorSystem {self.name!r} is terminated")
        return spawn_cell(self, self._guardian, None, props, name, f"atomr://{self.name}/user")

    @property
    def actors(self) -> list[ActorRef]:
        """Refs of the live top-level actors."""
        return [cell.ref for cell in self._guardian.children.values()]

    def schedule_once(self, delay: float, ref: ActorRef, message: Any) -> Cancellable:
        """Tell ``message`` to ``ref`` after ``delay`` seconds (cancelled on terminate).

        Raises:
            ValueError, TypeError: for a bad delay, or a ``ref`` that is not an ``ActorRef``.
            RuntimeError: if called off the system's loop, or if ``ref`` lives
                on another thread's event loop (its tick would be queued from
                this thread; schedule it on its own system).
        """
        scheduler = self.scheduler  # first: a call from another loop is refused as such
        _require_local("schedule_once", ref, "schedule it on its own system")
        return self._timers.schedule(scheduler, ref._cell, message, delay)

    async def terminate(self, timeout: float | None = DEFAULT_TERMINATE_TIMEOUT) -> None:
        """Stop every actor and wait until all their tasks are done. Safe to call
        more than once.

        Top-level actors stop one at a time, the last started first (as in
        Pykka), so an actor may use those started before it in its
        ``post_stop``; each stops its children first, and every ``post_stop``
        runs. The shutdown runs in a task of its own, so cancelling a caller
        does not cut it short. An actor may call it from its handler or its
        async ``pre_start`` (which is then cancelled as its actor stops); from
        a ``post_stop`` it starts the shutdown and returns at once, since
        waiting there would wait for that actor itself.

        Args:
            timeout: seconds to wait (> 0), or None to wait as long as it takes.
        Raises:
            TimeoutError: if actors were still stopping after ``timeout``
                seconds (a ``post_stop`` that never returns, a handler that
                swallows cancellation): they are named in the error and the
                log, their tasks cancelled and abandoned, and every wait on
                them ends.
            ValueError, TypeError: for a bad timeout.
        """
        check_timeout(timeout)
        if self._terminated is None:
            loop = self._running_loop()
            self._terminating = True
            self._timers.cancel_all()
            self._terminated = loop.create_task(
                self._stop_all(), name=f"atomr terminate {self.name}"
            )
        if in_post_stop():
            return
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(self._terminated)
        except TimeoutError:
            if self._terminated.done():
                return
            text = self._give_up(timeout)
            # every actor it waited on is ended now: it finishes within a loop
            # turn or two, and the abandoned tasks take their cancellation
            # meanwhile, so no task of it is left pending for a caller that
            # closes its loop next ("Task was destroyed but it is pending!")
            await asyncio.shield(self._terminated)
            raise TimeoutError(text) from None

    async def _stop_all(self) -> None:
        children = self._guardian.children
        while children:
            cell = children[next(reversed(children))]  # the last started
            cell.request_stop()
            await asyncio.wait((cell.stopped,))
            self._guardian.child_stopped(cell)

    def _give_up(self, timeout: float | None) -> str:
        """At terminate's deadline: abandon every actor still stopping (the
        shutdown task, waiting on one of them, then finishes by itself)."""
        left = list(self._guardian.children.values())
        self._guardian.children.clear()
        stuck = [cell for cell in left if cell.stop_requested]
        waiting = [cell for cell in left if not cell.stop_requested]
        for cell in left:
            discard(cell, "abandoned by terminate")
        text = (
            f"terminate of ActorSystem {self.name!r}: {len(left)} actor(s) not stopped "
            f"after {timeout} s, abandoned with their children (tasks cancelled)"
        )
        if stuck:
            text += f"; still stopping: {_labels(stuck)}"
        if waiting:
            text += f"; not yet asked to stop (their post_stop did not run): {_labels(waiting)}"
        logger.error(text)
        return text

    async def __aenter__(self) -> ActorSystem:
        self._running_loop()  # bind to it now
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.terminate(self.terminate_timeout)

    def __repr__(self) -> str:
        state = "terminated" if self._terminating else f"{len(self._guardian.children)} actors"
        return f"<ActorSystem {self.name!r} {state}>"


def _labels(cells: list[ActorCell]) -> str:
    """The first ten cells' labels, and how many more."""
    names = ", ".join(cell.label for cell in cells[:10])
    return names + (f" and {len(cells) - 10} more" if len(cells) > 10 else "")
