"""``AskDeadlines``: one timer for all of an actor's pending asks that share a
timeout, instead of one ``call_later`` handle per ask.

Asks with the same timeout reach their deadlines in the order they were made,
so they wait in a FIFO and one timer, armed at the oldest deadline, serves
them all. An ask that is answered leaves its entry behind; entries at the head
that are done are dropped as asks complete, and the queue is compacted when
out-of-order answers (deferred replies) let done entries pile up behind a
pending one, so memory stays bounded by the asks in flight.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["AskDeadlines"]

# (deadline, future, message); the ref and timeout are the lane's own
_Entry = tuple[float, "asyncio.Future[Any]", Any]

_COMPACT_FLOOR = 64
"""Queue length below which done entries are only dropped from the head."""


class AskDeadlines:
    """The pending asks of one actor that share one timeout.

    Args:
        loop: the actor's event loop (every method runs on it).
        timeout: the asks' timeout in seconds (> 0).
        expire: ``expire(message)`` builds the error an ask past its deadline gets.
    """

    __slots__ = ("_compact_at", "_entries", "_expire", "_handle", "_loop", "timeout")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        timeout: float,
        expire: Callable[[Any], BaseException],
    ) -> None:
        self._loop = loop
        self.timeout = timeout
        self._expire = expire
        self._entries: deque[_Entry] = deque()
        self._handle: asyncio.TimerHandle | None = None
        self._compact_at = _COMPACT_FLOOR

    def add(self, fut: asyncio.Future[Any], message: Any) -> None:
        """Give ``fut`` this lane's timeout, counted from now."""
        entries = self._entries
        entries.append((self._loop.time() + self.timeout, fut, message))
        if self._handle is None:
            self._handle = self._loop.call_at(entries[0][0], self._fire)

    def settle(self) -> None:
        """Drop the entries of answered asks (call after an ask completes)."""
        entries = self._entries
        while entries and entries[0][1].done():
            entries.popleft()
        if len(entries) > self._compact_at:
            kept = [entry for entry in entries if not entry[1].done()]
            self._entries = deque(kept)
            self._compact_at = max(_COMPACT_FLOOR, 2 * len(kept))

    def close(self) -> None:
        """The actor has stopped and failed the asks it held: forget them.
        An ask it forwarded is still pending elsewhere and keeps its
        deadline: the timer stays armed until the last such one ends."""
        kept = deque(entry for entry in self._entries if not entry[1].done())
        self._entries = kept
        if not kept and self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _fire(self) -> None:
        self._handle = None
        entries = self._entries
        now = self._loop.time()
        while entries:
            deadline, fut, message = entries[0]
            if not fut.done():
                if deadline > now:
                    break
                fut.set_exception(self._expire(message))
            entries.popleft()
        if entries:
            self._handle = self._loop.call_at(entries[0][0], self._fire)
