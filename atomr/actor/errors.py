"""Errors raised by the actor runtime."""

from __future__ import annotations

__all__ = [
    "ActorNameTakenError",
    "ActorStoppedError",
    "AskTimeoutError",
    "AtomrError",
    "InvalidActorNameError",
    "MailboxFullError",
]


class AtomrError(Exception):
    """Base class of every error the actor runtime raises."""


class AskTimeoutError(AtomrError, TimeoutError):
    """An ``ask`` got no answer within its timeout."""


class ActorStoppedError(AtomrError):
    """The actor is stopped (or stopped before answering), so it cannot take or answer a message."""


class MailboxFullError(AtomrError):
    """A bounded mailbox is full and its overflow policy refuses or drops the message."""


class InvalidActorNameError(AtomrError, ValueError):
    """An actor name is not a non-empty string without '/' or a leading '$'."""


class ActorNameTakenError(InvalidActorNameError):
    """A sibling with the same name is already alive."""
