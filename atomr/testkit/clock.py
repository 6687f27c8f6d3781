"""``ManualClock``: a scheduler whose time moves only when a test says so."""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from typing import Any

from atomr._arguments import real_number
from atomr._repr import bounded_repr
from atomr.actor.timers import check_delay

__all__ = ["MAX_CALLS_AT_ONE_TIME", "ManualClock"]


MAX_CALLS_AT_ONE_TIME = 100_000
"""The most callbacks one ``ManualClock.advance`` runs at one time before it
takes them for a livelock (a callback rescheduling itself with a delay of 0,
or one too small to move a float time on: a repeating timer of 1e-12 s at
time 1e6) and raises, instead of running forever."""


class _Call:
    """One scheduled callback; ``cancel()`` keeps it from running."""

    __slots__ = ("args", "callback", "cancelled", "due")

    def __init__(self, due: float, callback: Callable[..., object], args: tuple[Any, ...]) -> None:
        self.due = due
        self.callback = callback
        self.args = args
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    """A clock for ``ActorSystem(scheduler=clock)`` (Akka's explicitly triggered
    scheduler): timers, receive timeouts and supervision's restart windows
    then run on it, and nothing fires until ``advance``. Ask timeouts and
    ``asyncio.sleep`` keep real time.

    ``advance`` runs what is due at once, in time order; the actors then handle
    the messages on their next turn, so await what they do (``probe.expect_msg``).
    A receive timeout is set when its actor goes idle: advance once the actor
    has handled what was sent to it (after an ``ask`` it has).

    Args:
        start: the clock's time at first.

    Raises:
        TypeError: ``start`` is not a real number (a bool or a str is not).
        ValueError: ``start`` is NaN or infinite (nothing would ever fall due).
    """

    def __init__(self, start: float = 0.0) -> None:
        now = real_number("start", start)
        if not math.isfinite(now):
            raise ValueError(f"start must be finite: nothing would ever fall due; got {now}")
        self._now = now
        self._calls: list[tuple[float, int, _Call]] = []
        self._order = itertools.count()

    def time(self) -> float:
        """The clock's current time in seconds."""
        return self._now

    def call_later(self, delay: float, callback: Callable[..., object], *args: Any) -> _Call:
        """Schedule ``callback(*args)`` at ``time() + delay`` (what the runtime calls).

        Returns:
            A handle with ``cancel()``.
        Raises:
            ValueError, TypeError: for a negative or non-numeric delay.
            TypeError: ``callback`` is not callable (as ``loop.call_later``;
                it failed the ``advance`` that reached it).
        """
        delay = check_delay("delay", delay, allow_zero=True)
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {bounded_repr(callback)}")
        call = _Call(self._now + delay, callback, args)
        heapq.heappush(self._calls, (call.due, next(self._order), call))
        return call

    @property
    def pending(self) -> int:
        """How many scheduled callbacks are waiting (cancelled ones excluded)."""
        return sum(1 for _, _, call in self._calls if not call.cancelled)

    def advance(self, seconds: float) -> int:
        """Move time forward by ``seconds``, running every callback that falls
        due on the way, in time order (a repeating timer fires once per interval).

        Returns:
            How many callbacks ran.
        Raises:
            ValueError, TypeError: for a negative, infinite or non-numeric
                ``seconds`` (a repeating timer would fall due forever).
            RuntimeError: once ``MAX_CALLS_AT_ONE_TIME`` callbacks ran at one
                time (the clock's time could never move on); left as when a
                callback raises.
            Exception: whatever a callback raises; time then stays at that
                callback's due time, and the callbacks due after it stay
                scheduled for the next ``advance``.
        """
        seconds = check_delay("seconds", seconds, allow_zero=True)
        if math.isinf(seconds):
            raise ValueError(
                "seconds must be finite: a repeating timer would fall due forever; got inf"
            )
        target = self._now + seconds
        ran = 0
        calls = self._calls
        stuck = 0  # callbacks run at the time now (a livelock never moves it on)
        while calls and calls[0][0] <= target:
            due, _, call = heapq.heappop(calls)
            if call.cancelled:
                continue
            if due != self._now:
                self._now = due
                stuck = 0
            elif stuck == MAX_CALLS_AT_ONE_TIME:
                heapq.heappush(calls, (due, next(self._order), call))  # still scheduled
                raise RuntimeError(_stuck(due))
            stuck += 1
            call.callback(*call.args)
            ran += 1
        self._now = target
        return ran

    def __repr__(self) -> str:
        return f"ManualClock(time={self._now}, pending={self.pending})"


def _stuck(time: float) -> str:
    return (
        f"ManualClock.advance ran {MAX_CALLS_AT_ONE_TIME} callbacks at time {time} "
        "without time moving on: a callback (a repeating timer) keeps rescheduling "
        f"itself with a delay of 0, or one too small to move a float time of {time} "
        "on; time stays there, the callback scheduled"
    )
