"""The envelope: what travels through a mailbox.

An envelope is a plain 3-tuple ``(message, sender, reply)``: the user's
message, the ``ActorRef`` given to ``tell(sender=...)`` (or None), and the
future of an ``ask`` (None for a ``tell``). A tuple is the cheapest object
Python can build, which keeps ``tell`` fast; the indices are named below.
While a message is handled, ``defer``, ``stash`` and ``forward`` take its
reply away by replacing the cell's current envelope with one whose reply is
None, so the handler's return value then answers nothing.

A timer's message travels as a 4-tuple ``(message, None, None, timer)``: the
runtime reads only the first three items, so code that handles envelopes
indexes them and never unpacks three names.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    from .ref import ActorRef
    from .timers import Cancellable

__all__ = ["MESSAGE", "REPLY", "SENDER", "Envelope"]

Envelope: TypeAlias = (
    "tuple[Any, ActorRef | None, asyncio.Future[Any] | None] | tuple[Any, None, None, Cancellable]"
)
"""``(message, sender, reply)``, or a timer's ``(message, None, None, timer)``."""

MESSAGE = 0
SENDER = 1
REPLY = 2
