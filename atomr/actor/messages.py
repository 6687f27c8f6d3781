"""Messages the runtime itself sends or understands."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import bounded_repr

if TYPE_CHECKING:
    from .ref import ActorRef

__all__ = ["DeadLetter", "PoisonPill", "ReceiveTimeout", "Terminated"]


@dataclass(frozen=True, slots=True)
class Terminated:
    """Sent to every watcher of an actor once that actor has stopped.

    Attributes:
        ref: the stopped actor.
    """

    ref: ActorRef


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A message that could not be delivered, published on ``system.dead_letters``.

    Attributes:
        message: the undelivered message.
        sender: its sender, or None.
        recipient: the actor it was meant for.
        reason: why it was not delivered ("stopped", "mailbox full", ...).
    """

    message: Any
    sender: ActorRef | None
    recipient: ActorRef
    reason: str = "stopped"

    def __repr__(self) -> str:
        return (
            f"DeadLetter(message={bounded_repr(self.message)}, sender={self.sender!r}, "
            f"recipient={self.recipient!r}, reason={self.reason!r})"
        )


@dataclass(frozen=True, slots=True)
class PoisonPill:
    """Told to an actor, stops it once every message queued before it is handled."""


@dataclass(frozen=True, slots=True)
class ReceiveTimeout:
    """Sent to an actor that set a receive timeout and got no message for that long."""
