"""``ActorSystem``: owns the top-level actors, dead letters and shutdown."""

from __future__ import annotations

import asyncio
import logging
from types import TracebackType
from typing import Any

from .cell import ActorCell, decide, spawn_cell
from .dead_letters import DeadLetters
from .props import Props
from .ref import ActorRef
from .supervision import Directive, OneForOneStrategy, SupervisorStrategy
from .timers import Cancellable, TimerSet

__all__ = ["ActorSystem"]

logger = logging.getLogger("atomr.actor")


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
        logger.error("%s escalated %r to the guardian; stopping it", child.path, error)
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
    Raises:
        ValueError: for an empty name.
        TypeError: for a non-string name or a bad strategy.
    """

    def __init__(
        self, name: str = "atomr", *, guardian_strategy: SupervisorStrategy | None = None
    ) -> None:
        if not isinstance(name, str):
            raise TypeError(f"system name must be a str, got {type(name).__name__}")
        if not name or "/" in name:
            raise ValueError(f"invalid system name {name!r}")
        if guardian_strategy is not None and not isinstance(guardian_strategy, SupervisorStrategy):
            raise TypeError("guardian_strategy must be a SupervisorStrategy")
        self.name = name
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
        """The event loop the system runs on.

        Raises:
            RuntimeError: if used without a running loop, or from another loop.
        """
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                "ActorSystem needs a running event loop: use it inside a coroutine "
                "(e.g. atomr.run(main()))"
            ) from None
        if self._loop is None or (self._loop.is_closed() and not self._guardian.children):
            self._loop = running
        elif running is not self._loop:
            raise RuntimeError(f"ActorSystem {self.name!r} belongs to another event loop")
        return self._loop

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
        loop = self.loop
        if self._terminating:
            raise RuntimeError(f"ActorSystem {self.name!r} is terminated")
        del loop
        return spawn_cell(self, self._guardian, None, props, name, f"atomr://{self.name}/user")

    @property
    def actors(self) -> list[ActorRef]:
        """Refs of the live top-level actors."""
        return [cell.ref for cell in self._guardian.children.values()]

    def schedule_once(self, delay: float, ref: ActorRef, message: Any) -> Cancellable:
        """Tell ``message`` to ``ref`` after ``delay`` seconds (cancelled on terminate).

        Raises:
            ValueError, TypeError: for a bad delay.
        """
        return self._timers.schedule_once(
            self.loop, delay, lambda: ref._cell.post_internal(message)
        )

    async def terminate(self) -> None:
        """Stop every actor (children before parents, every ``post_stop`` run) and
        wait until all their tasks are done. Safe to call more than once.

        The shutdown runs in a task of its own, so cancelling a caller does not
        cut it short, and an actor may call it from its handler (that handler
        is then cancelled as its actor stops).
        """
        if self._terminated is None:
            loop = self.loop
            self._terminating = True
            self._timers.cancel_all()
            self._terminated = loop.create_task(
                self._stop_all(), name=f"atomr terminate {self.name}"
            )
        await asyncio.shield(self._terminated)

    async def _stop_all(self) -> None:
        while self._guardian.children:
            cells = list(self._guardian.children.values())
            for cell in cells:
                cell.request_stop()
            tasks = [c.task for c in cells if c.task is not None]
            if tasks:
                await asyncio.wait(tasks)
            for cell in cells:
                self._guardian.child_stopped(cell)

    async def __aenter__(self) -> ActorSystem:
        self.loop  # noqa: B018 - bind to the running loop now
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.terminate()

    def __repr__(self) -> str:
        state = "terminated" if self._terminating else f"{len(self._guardian.children)} actors"
        return f"<ActorSystem {self.name!r} {state}>"
