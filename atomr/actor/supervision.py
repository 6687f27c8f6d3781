"""Supervision: directives and the strategies a parent applies to failed children."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

from atomr._arguments import int_at_least

from .errors import bounded_repr
from .ref import check_timeout

if TYPE_CHECKING:
    from .ref import ActorRef

__all__ = [
    "AllForOneStrategy",
    "Directive",
    "OneForOneStrategy",
    "SupervisorStrategy",
    "default_decider",
]


class Directive(enum.Enum):
    """What a supervisor does with a child whose handler raised."""

    RESUME = "resume"
    """Keep the instance and its state; the failing message is dropped."""
    RESTART = "restart"
    """Replace the instance by a new one from Props (hooks called, mailbox kept)."""
    STOP = "stop"
    """Stop the child."""
    ESCALATE = "escalate"
    """Fail the supervisor itself with the same error; its own parent decides."""


def default_decider(error: BaseException) -> Directive:
    """Akka's default: restart on any ``Exception``."""
    return Directive.RESTART


class SupervisorStrategy:
    """Base of the strategies; use ``OneForOneStrategy`` or ``AllForOneStrategy``.

    Args:
        max_restarts: restarts allowed for a child within ``within`` seconds;
            one more failure that asks for a restart stops the child instead.
            None: unlimited.
        within: the window in seconds for ``max_restarts``; None: count forever.
        decider: maps the error to a ``Directive`` (default: always RESTART).
    Raises:
        ValueError: for a negative ``max_restarts`` or a ``within`` <= 0.
        TypeError: if ``max_restarts`` is not an int (NumPy's are; a bool is
            not) or None, ``within`` not a number of seconds or None (the one
            rules of `_arguments.int_at_least` and `check_timeout`), or
            ``decider`` is not callable.
    """

    applies_to_all: ClassVar[bool] = False

    def __init__(
        self,
        max_restarts: int | None = None,
        within: float | None = None,
        decider: Callable[[BaseException], Directive] | None = None,
    ) -> None:
        if max_restarts is not None:
            max_restarts = int_at_least("max_restarts", max_restarts, 0)
        within = check_timeout(within, "within")
        if decider is not None and not callable(decider):
            raise TypeError(f"decider must be callable, got {type(decider).__name__}")
        self.max_restarts = max_restarts
        self.within = within
        self.decider: Callable[[BaseException], Directive] = decider or default_decider

    def decide(self, error: BaseException) -> Directive:
        """Return the decider's directive for ``error``.

        Raises:
            TypeError: if the decider returns something other than a ``Directive``.
        """
        directive = self.decider(error)
        if not isinstance(directive, Directive):
            raise TypeError(f"decider returned {bounded_repr(directive)}, expected a Directive")
        return directive

    def directive_for(self, child: ActorRef, error: BaseException) -> Directive:
        """The directive for ``child``'s failure with ``error``: by default
        ``decide(error)``. Override it to take the child into account (Akka's
        ``handleFailure`` sees the child too).

        Raises:
            TypeError: if the decider returns something other than a ``Directive``.
        """
        return self.decide(error)

    def allows_restart(self, history: list[float], now: float) -> bool:
        """Record a restart at ``now`` in ``history`` if the window allows it.

        Args:
            history: the child's restart times (mutated).
            now: the current time of the system's scheduler.
        Returns:
            False when ``max_restarts`` restarts already happened within ``within``.
        """
        if self.max_restarts is None:
            return True
        if self.within is not None:
            horizon = now - self.within
            expired = 0
            while expired < len(history) and history[expired] < horizon:
                expired += 1
            del history[:expired]
        if len(history) >= self.max_restarts:
            return False
        history.append(now)
        return True

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(max_restarts={self.max_restarts}, "
            f"within={self.within}, decider={getattr(self.decider, '__name__', self.decider)})"
        )


class OneForOneStrategy(SupervisorStrategy):
    """The directive applies to the failed child only (the default)."""


class AllForOneStrategy(SupervisorStrategy):
    """A RESTART or STOP applies to every child of the supervisor.

    A restart restarts every child, so it counts against ``max_restarts`` for
    each of them (as in Akka): past it, a failure of any child stops them all.
    """

    applies_to_all = True
