"""``Props``: the recipe to create (and re-create on restart) an actor."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from .actor import Actor
from .errors import bounded_repr
from .mailbox import Mailbox
from .supervision import SupervisorStrategy

__all__ = ["Props"]


class Props:
    """How to build an actor: ``Props(MyActor, *args, **kwargs)``.

    The factory (usually the class) is called with ``args``/``kwargs`` on
    spawn and again on every restart. Options return a new ``Props``.

    Raises:
        TypeError: if ``factory`` is not callable.
    """

    def __init__(self, factory: Callable[..., Actor], *args: Any, **kwargs: Any) -> None:
        if not callable(factory):
            raise TypeError(f"Props expects a callable factory, got {type(factory).__name__}")
        self.factory = factory
        self.args = args
        self.kwargs = kwargs
        self.mailbox: Mailbox | None = None
        self.supervisor_strategy: SupervisorStrategy | None = None

    def create(self) -> Actor:
        """Build a new instance.

        Raises:
            TypeError: if the factory returns something that is not an ``Actor``.
        """
        instance = self.factory(*self.args, **self.kwargs)
        if not isinstance(instance, Actor):
            raise TypeError(
                f"Props factory {bounded_repr(self.factory)} returned "
                f"{type(instance).__name__}, not an Actor"
            )
        return instance

    @property
    def class_name(self) -> str:
        """The factory's name (usually the actor's class), as error texts show it."""
        return getattr(self.factory, "__name__", type(self.factory).__name__)

    def with_mailbox(self, mailbox: Mailbox) -> Props:
        """Return a copy using ``mailbox`` (a template; each actor gets its own copy).

        Raises:
            TypeError: if ``mailbox`` is not a ``Mailbox``.
        """
        if not isinstance(mailbox, Mailbox):
            raise TypeError(f"with_mailbox expects a Mailbox, got {type(mailbox).__name__}")
        new = copy.copy(self)
        new.mailbox = mailbox
        return new

    def with_supervisor_strategy(self, strategy: SupervisorStrategy) -> Props:
        """Return a copy whose actor supervises its children with ``strategy``
        (instead of its ``supervisor_strategy()`` method).

        Raises:
            TypeError: if ``strategy`` is not a ``SupervisorStrategy``.
        """
        if not isinstance(strategy, SupervisorStrategy):
            raise TypeError(
                f"with_supervisor_strategy expects a SupervisorStrategy, got {type(strategy).__name__}"
            )
        new = copy.copy(self)
        new.supervisor_strategy = strategy
        return new

    def __repr__(self) -> str:
        return f"Props({self.class_name})"
