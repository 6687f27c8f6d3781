"""``await_condition`` and ``wait_until``: wait for a condition under a
deadline, instead of sleeping a fixed time and hoping it came (Akka's
``awaitCond``).

``await_condition`` is for async tests (it sleeps on the event loop, so the
actors under test keep running); ``wait_until`` is its twin for plain
threads and processes (it blocks the calling thread).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Iterator

__all__ = ["await_condition", "wait_until"]


def _deadline(timeout: float, interval: float) -> float:
    """The monotonic time the wait gives up at.

    Raises:
        ValueError: if ``timeout`` or ``interval`` is not a finite number > 0.
    """
    for name, value in (("timeout", timeout), ("interval", interval)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{name} must be a number of seconds, got {value!r}")
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"{name} must be finite and > 0, got {value!r}")
    return time.monotonic() + timeout


def _pauses(
    condition: Callable[[], object], timeout: float, interval: float, message: str
) -> Iterator[float]:
    """The pauses to sleep between checks of `condition`, until it is true
    (the checks of both waits: only how they sleep differs).

    Raises:
        AssertionError: the condition is still false at the deadline.
        ValueError: as `_deadline`.
    """
    deadline = _deadline(timeout, interval)
    while not condition():
        left = deadline - time.monotonic()
        if left <= 0:
            what = message or getattr(condition, "__name__", repr(condition))
            raise AssertionError(f"condition not met within {timeout} s: {what}")
        yield min(interval, left)


async def await_condition(
    condition: Callable[[], object],
    *,
    timeout: float = 3.0,
    interval: float = 0.01,
    message: str = "",
) -> None:
    """Return as soon as ``condition()`` is true; check it every ``interval``
    seconds (sleeping on the loop between checks) for up to ``timeout``.

    ``await await_condition(lambda: not ref.is_alive, message="the actor stopped")``.
    The condition is checked once more at the deadline, so a condition met
    just in time passes.

    Raises:
        AssertionError: if the condition is still false at the deadline; the
            message names ``message``, or the condition's ``__name__``.
        ValueError: if ``timeout`` or ``interval`` is not a finite number > 0.
        Exception: whatever ``condition`` raises, at once.
    """
    for pause in _pauses(condition, timeout, interval, message):
        await asyncio.sleep(pause)


def wait_until(
    condition: Callable[[], object],
    *,
    timeout: float = 3.0,
    interval: float = 0.01,
    message: str = "",
) -> None:
    """Block the calling thread until ``condition()`` is true; check it every
    ``interval`` seconds for up to ``timeout`` (``await_condition`` for code
    with no event loop, such as a test driving subprocesses).

    Raises:
        AssertionError: if the condition is still false at the deadline.
        ValueError: if ``timeout`` or ``interval`` is not a finite number > 0.
        Exception: whatever ``condition`` raises, at once.
    """
    for pause in _pauses(condition, timeout, interval, message):
        time.sleep(pause)
