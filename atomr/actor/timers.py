"""Timers: one-shot and repeating messages, cancellable, keyed, owned by an actor.

A timer's message (its *tick*) travels as a 4-tuple envelope
``(message, None, None, timer)``: the runtime reads only the first three items,
and ``cancel()`` uses the fourth to take a tick that is already queued back out
of the mailbox. So a cancelled or replaced timer's message is never received,
as Akka guarantees, at no cost to other messages.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from typing import Any, Protocol

from atomr._arguments import real_number

from .errors import bounded_repr

__all__ = ["Cancellable", "Scheduler", "TickTarget", "TimerSet", "as_seconds"]


class TimerHandle(Protocol):
    """What ``Scheduler.call_later`` returns."""

    def cancel(self) -> None: ...


class Scheduler(Protocol):
    """The clock behind timers, receive timeouts and supervision's restart window.

    An asyncio event loop is one (the default); ``atomr.testkit.ManualClock``
    is another, whose time moves only when a test says so.
    """

    def time(self) -> float: ...

    def call_later(self, delay: float, callback: Callable[..., object], *args: Any) -> Any: ...


class TickTarget(Protocol):
    """The actor a timer tells (an ``ActorCell``)."""

    def post_tick(self, message: Any, timer: Cancellable) -> None: ...

    def remove_ticks(self, match: Callable[[Cancellable], bool]) -> list[Cancellable]: ...


class Cancellable:
    """Handle of a scheduled message.

    ``cancel()`` stops the timer and takes its message back if it is already
    queued, so a cancelled timer's message is never received.
    """

    __slots__ = (
        "_cancelled",
        "_handle",
        "_interval",
        "_message",
        "_scheduler",
        "_target",
        "key",
        "timers",
    )

    def __init__(
        self,
        timers: TimerSet,
        scheduler: Scheduler,
        target: TickTarget,
        message: Any,
        delay: float,
        interval: float | None,
        key: Hashable | None,
    ) -> None:
        self.timers = timers
        self.key = key
        self._scheduler = scheduler
        self._target = target
        self._message = message
        self._interval = interval
        self._cancelled = False
        self._handle: TimerHandle | None = scheduler.call_later(delay, self._fire)

    def _fire(self) -> None:
        if self._cancelled:
            return
        if self._interval is None:
            self._handle = None
            self.timers.fired(self)
        else:
            self._handle = self._scheduler.call_later(self._interval, self._fire)
        self._target.post_tick(self._message, self)

    @property
    def cancelled(self) -> bool:
        """True once ``cancel()`` prevented a message: the timer had not fired, or
        its message was still queued (Akka's ``isCancelled``). A one-shot timer
        whose message was already received stays False."""
        return self._cancelled

    @property
    def active(self) -> bool:
        """True while the timer may still fire."""
        return not self._cancelled and self._handle is not None

    def cancel(self) -> bool:
        """Stop the timer and take its queued message, if any, back out of the mailbox.

        Returns:
            True if this call prevented a message (see ``cancelled``); False if
            it was already cancelled, or was a one-shot timer whose message was
            already received.
        """
        if self._cancelled:
            return False
        pending = self._stop()
        taken = self._target.remove_ticks(lambda timer: timer is self)
        self._cancelled = pending or bool(taken)
        return self._cancelled

    def _stop(self) -> bool:
        """Cancel the scheduled call; True if there was one."""
        handle = self._handle
        self.timers.forget(self)
        if handle is None:
            return False
        handle.cancel()
        self._handle = None
        self._cancelled = True
        return True

    def __repr__(self) -> str:
        key = "" if self.key is None else f"key={bounded_repr(self.key)}, "
        return f"Cancellable({key}active={self.active}, cancelled={self._cancelled})"


def check_delay(
    name: str, value: float, allow_zero: bool, *, or_none: bool = False, finite: bool = False
) -> float:
    """Validate a delay in seconds: a real number (`_arguments.real_number`:
    NumPy's scalars too, a bool not), returned as a float. The one rule of
    the runtime's and the trainers' delays and timeouts (`check_timeout`).

    Args:
        name: the argument's name, for the messages.
        value: the delay.
        allow_zero: 0 is a delay (else it must be > 0).
        or_none: the messages offer None (the caller takes it: no deadline).
        finite: infinity is refused (else it is a delay that never ends).

    Raises:
        TypeError: for a value that is not a real number.
        ValueError: for a negative or NaN value (or zero, unless ``allow_zero``;
            infinity with ``finite``), or an int too large for a float.
    """
    none = " or None" if or_none else ""
    if value.__class__ is not float and value.__class__ is not int:  # those are real
        try:
            real_number(name, value)
        except TypeError:
            raise TypeError(
                f"{name} must be a number of seconds{none}, got {type(value).__name__}"
            ) from None
    if value < 0 or (value == 0 and not allow_zero) or value != value:
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be {bound} seconds{none}, got {bounded_repr(value)}")
    seconds = as_seconds(name, value)
    if finite and seconds == math.inf:
        raise ValueError(f"{name} must be a finite number of seconds{none}, got {value}")
    return seconds


def as_seconds(name: str, value: float) -> float:
    """A checked number of seconds as a float.

    Raises:
        ValueError: an int too large for a float (a float's inf is kept).
    """
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"{name} is too large: {bounded_repr(value)} seconds") from None


class TimerSet:
    """The live timers of one owner (an actor or the system), cancelled together.

    A key finds its live timer only: a one-shot timer that fired is forgotten
    at once (its message and all, once received), so a key per request does
    not pile up. Its message may still wait in the mailbox, so replacing or
    cancelling a key with no live timer looks there for it, at the cost of a
    pass over the mailbox only while such a message may be queued.
    """

    __slots__ = ("_fired", "_keyed", "_timers")

    def __init__(self) -> None:
        # made on the first schedule: most actors never start a timer
        self._timers: set[Cancellable] | None = None
        self._keyed: dict[Hashable, Cancellable] | None = None
        self._fired = 0  # keyed one-shots fired since their mailbox was last looked at

    def schedule(
        self,
        scheduler: Scheduler,
        target: TickTarget,
        message: Any,
        delay: float,
        interval: float | None = None,
        key: Hashable | None = None,
    ) -> Cancellable:
        """Tell ``message`` to ``target`` after ``delay`` seconds, then every
        ``interval`` seconds if given. A timer with the same ``key`` is
        replaced: cancelled, its queued message taken back.

        Raises:
            ValueError: for a negative or NaN delay, or an interval <= 0.
            TypeError: for values that are not numbers, or an unhashable key.
        """
        if interval is not None:
            interval = check_delay("interval", interval, allow_zero=False)
        delay = check_delay("delay", delay, allow_zero=True)
        if key is not None:
            hash(key)
            self.cancel(key, target)
        timer = Cancellable(self, scheduler, target, message, delay, interval, key)
        if self._timers is None:
            self._timers, self._keyed = set(), {}
        self._timers.add(timer)
        if key is not None:
            self._keyed[key] = timer  # type: ignore[index]
        return timer

    def cancel(self, key: Hashable, target: TickTarget) -> bool:
        """Cancel the timer started with ``key`` (see ``Cancellable.cancel``):
        the live one, or a one-shot that fired and whose message still waits
        in ``target``'s mailbox.

        Returns:
            False if there is none, or its message was already received.
        """
        timer = self._keyed.get(key) if self._keyed is not None else None
        if timer is not None:
            return timer.cancel()
        if not self._fired:
            return False
        queued = 0

        def match(timer: Cancellable) -> bool:
            nonlocal queued
            if timer.timers is not self or timer._interval is not None or timer.key is None:
                return False
            if timer.key == key:
                return True
            queued += 1
            return False

        taken = target.remove_ticks(match)
        self._fired = queued
        for timer in taken:
            timer._cancelled = True
        return bool(taken)

    def fired(self, timer: Cancellable) -> None:
        """A one-shot ``timer`` fired: no longer live, and its key is free (its
        message, if queued, is found by ``cancel``)."""
        if self._timers is not None:
            self._timers.discard(timer)
        if timer.key is not None and self._keyed is not None:
            if self._keyed.get(timer.key) is timer:
                del self._keyed[timer.key]
            self._fired += 1

    def forget(self, timer: Cancellable) -> None:
        """Drop ``timer`` for good (cancelled)."""
        if self._timers is None or self._keyed is None:
            return
        self._timers.discard(timer)
        if timer.key is not None and self._keyed.get(timer.key) is timer:
            del self._keyed[timer.key]

    def cancel_all(self, target: TickTarget | None = None) -> None:
        """Cancel every live timer; with ``target``, also take back, in one pass
        over its mailbox, every queued message of a timer of this set (those of
        one-shot timers that already fired included: an actor's restart).
        """
        if self._timers is not None:
            for timer in list(self._timers):
                timer._stop()
            self._timers = self._keyed = None
        if target is not None:
            for timer in target.remove_ticks(lambda timer: timer.timers is self):
                timer._cancelled = True
            self._fired = 0

    def __len__(self) -> int:
        return len(self._timers) if self._timers is not None else 0
