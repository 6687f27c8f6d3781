"""Errors raised by the actor runtime, and ``bounded_repr`` (re-exported from
``atomr._repr``), the one way their texts (and the runtime's log lines) show a
user's object."""

from __future__ import annotations

from atomr._repr import REPR_LIMIT, bounded_repr

__all__ = [
    "ActorNameTakenError",
    "ActorStoppedError",
    "AskTimeoutError",
    "AtomrError",
    "InvalidActorNameError",
    "MailboxFullError",
    "REPR_LIMIT",
    "bounded_repr",
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
    """An actor name is not a non-empty string of at most 255 characters
    without '/', '#', '?', control or format characters, surrounding spaces
    or a leading '$', and other than '.' and '..'."""


class ActorNameTakenError(InvalidActorNameError):
    """A sibling with the same name is already alive."""
