"""Timers: one-shot and repeating messages, cancellable, owned by an actor."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["Cancellable", "TimerSet"]


class Cancellable:
    """Handle of a scheduled message; ``cancel()`` stops it from (re)firing."""

    __slots__ = ("_callback", "_handle", "_interval", "_loop", "_owner", "cancelled")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        delay: float,
        callback: Callable[[], None],
        interval: float | None,
        owner: TimerSet | None,
    ) -> None:
        self._loop = loop
        self._callback = callback
        self._interval = interval
        self._owner = owner
        self.cancelled = False
        self._handle: asyncio.TimerHandle | None = loop.call_later(delay, self._fire)

    def _fire(self) -> None:
        if self.cancelled:
            return
        if self._interval is None:
            self._handle = None
            if self._owner is not None:
                self._owner.discard(self)
        else:
            self._handle = self._loop.call_later(self._interval, self._fire)
        self._callback()

    @property
    def active(self) -> bool:
        """True while the timer may still fire."""
        return not self.cancelled and self._handle is not None

    def cancel(self) -> None:
        """Stop the timer; safe to call more than once."""
        self.cancelled = True
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._owner is not None:
            self._owner.discard(self)
            self._owner = None

    def __repr__(self) -> str:
        return f"Cancellable(active={self.active})"


def _check_delay(name: str, value: float, allow_zero: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__}")
    if value < 0 or (value == 0 and not allow_zero) or value != value:
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be {bound} seconds, got {value}")
    return float(value)


class TimerSet:
    """The live timers of one owner (an actor or the system), cancelled together."""

    def __init__(self) -> None:
        self._timers: set[Cancellable] = set()

    def schedule_once(
        self, loop: asyncio.AbstractEventLoop, delay: float, callback: Callable[[], None]
    ) -> Cancellable:
        """Call ``callback`` once after ``delay`` seconds.

        Raises:
            ValueError: for a negative or NaN delay.
            TypeError: for a delay that is not a number.
        """
        delay = _check_delay("delay", delay, allow_zero=True)
        timer = Cancellable(loop, delay, callback, None, self)
        self._timers.add(timer)
        return timer

    def schedule_repeatedly(
        self,
        loop: asyncio.AbstractEventLoop,
        interval: float,
        callback: Callable[[], None],
        initial_delay: float | None = None,
    ) -> Cancellable:
        """Call ``callback`` every ``interval`` seconds (first after ``initial_delay``).

        Raises:
            ValueError: for an interval <= 0 or a negative initial delay.
            TypeError: for values that are not numbers.
        """
        interval = _check_delay("interval", interval, allow_zero=False)
        first = (
            interval
            if initial_delay is None
            else _check_delay("initial_delay", initial_delay, True)
        )
        timer = Cancellable(loop, first, callback, interval, self)
        self._timers.add(timer)
        return timer

    def discard(self, timer: Cancellable) -> None:
        """Forget ``timer`` (it fired or was cancelled)."""
        self._timers.discard(timer)

    def cancel_all(self) -> None:
        """Cancel every live timer."""
        for timer in list(self._timers):
            timer.cancel()
        self._timers.clear()

    def __len__(self) -> int:
        return len(self._timers)
