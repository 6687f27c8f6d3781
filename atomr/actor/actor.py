"""The ``Actor`` base class: subclass it and implement ``receive``."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .context import Context
    from .supervision import SupervisorStrategy

__all__ = ["Actor"]


class _Creating(threading.local):
    """The context of the actor the runtime is building on this thread, so
    that ``self.context`` already works inside ``__init__``. The first
    ``Actor.__new__`` takes it: an actor instantiated directly inside that
    constructor gets none, as at top level. Per thread: systems on other
    threads' loops build their actors at the same time."""

    context: Context | None = None


_creating = _Creating()


def bind_context(instance: Actor, context: Context) -> None:
    """Make `context` the context of `instance`, just built by a `Props`.

    Raises:
        TypeError: `instance` already belongs to another actor (a factory
            that returns one shared instance).
    """
    own = instance._context
    if own is not None and own is not context:
        raise TypeError(
            f"the Props of {context.self_ref.path} made an actor that belongs to "
            f"{own.self_ref.path}: a factory must build a new actor each time"
        )
    instance._context = context


class Actor:
    """Base class of actors.

    Implement ``receive(self, message)``, plain or ``async``; its return value
    answers an ``ask`` (``return Failure(exc)`` answers with an error without
    failing the actor). One message is handled at a time. Create actors with
    ``system.spawn(Props(MyActor, ...))`` or ``self.context.spawn(...)``, never
    by calling the class directly.
    """

    _context: Context | None = None

    def __new__(cls, *args: Any, **kwargs: Any) -> Actor:
        obj = super().__new__(cls)
        creating = _creating
        obj._context = creating.context
        creating.context = None
        return obj

    @property
    def context(self) -> Context:
        """This actor's ``Context`` (self_ref, sender, spawn, timers, ...).

        Raises:
            RuntimeError: if the instance was not created by ``spawn``.
        """
        ctx = self._context
        if ctx is None:
            raise RuntimeError(
                f"{type(self).__name__} was not created by spawn (an actor instantiated "
                "directly, at top level or inside another actor's constructor, has no "
                "context); use system.spawn(Props(...)) or self.context.spawn(Props(...))"
            )
        return ctx

    def receive(self, message: Any) -> Any:
        """Handle one message; the return value answers an ask.

        May be ``async def``. A plain ``receive`` that returns a coroutine
        (``return self.helper(m)`` with an async helper) has it awaited, as
        a hook's would be, and the ask is answered with its result.

        Raises:
            NotImplementedError: unless a subclass implements it.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement receive(message)")

    def pre_start(self) -> Any:
        """Called (and awaited if async) before the first message."""
        return None

    def post_stop(self) -> Any:
        """Called (and awaited if async) once stopped, after the children stopped."""
        return None

    def pre_restart(self, error: BaseException, message: Any) -> Any:
        """Called on the failed instance before a restart (its children are
        already stopped, as in Akka); default calls ``post_stop``.

        Args:
            error: the exception that caused the restart.
            message: the message being handled, or None.
        """
        return self.post_stop()

    def post_restart(self, error: BaseException) -> Any:
        """Called on the new instance after a restart; default calls ``pre_start``.

        Args:
            error: the exception that caused the restart.
        """
        return self.pre_start()

    def supervisor_strategy(self) -> SupervisorStrategy:
        """The strategy applied to this actor's failed children (default: restart)."""
        from .supervision import OneForOneStrategy

        return OneForOneStrategy()
