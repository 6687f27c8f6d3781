"""``await_condition`` and ``wait_until``: wait for a condition under a
deadline, instead of sleeping a fixed time and hoping it came (Akka's
``awaitCond``).

``await_condition`` is for async tests (it sleeps on the event loop, so the
actors under test keep running); ``wait_until`` is its twin for plain
threads and processes (it blocks the calling thread).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

from atomr._repr import bounded_repr
from atomr.actor.timers import check_delay
from atomr.testkit._matching import not_awaitable

__all__ = ["await_condition", "wait_until"]


def _deadline(timeout: float, interval: float) -> float:
    """The monotonic time the wait gives up at.

    Raises:
        TypeError: if ``timeout`` or ``interval`` is not a number of seconds
            (NumPy's are; a bool is not).
        ValueError: if either is not finite and > 0.
    """
    timeout = check_delay("timeout", timeout, allow_zero=False, finite=True)
    check_delay("interval", interval, allow_zero=False, finite=True)
    return time.monotonic() + timeout


def _holds(condition: Callable[[], object]) -> object:
    """What ``condition()`` returns, refused if it is awaitable (``not_awaitable``).

    Raises:
        TypeError: ``condition()`` returned an awaitable.
    """
    return not_awaitable(condition(), f"condition {_name(condition)}")


def _name(condition: Callable[[], object]) -> str:
    """The condition's name, and for a lambda where it was written."""
    name = getattr(condition, "__name__", None) or bounded_repr(condition)
    code = getattr(condition, "__code__", None)
    if name == "<lambda>" and code is not None:
        return f"<lambda> at {code.co_filename}:{code.co_firstlineno}"
    return name


def _pauses(
    condition: Callable[[], object], timeout: float, interval: float, message: str
) -> Iterator[float]:
    """The pauses to sleep between checks of `condition`, until it is true
    (the checks of both waits: only how they sleep differs).

    Raises:
        AssertionError: the condition is still false at the deadline.
        TypeError: `condition` is not callable, or returns an awaitable; as
            `_deadline`.
        ValueError: as `_deadline`.
    """
    if not callable(condition):
        raise TypeError(f"condition must be a function, got {bounded_repr(condition)}")
    deadline = _deadline(timeout, interval)
    while not (value := _holds(condition)):
        left = deadline - time.monotonic()
        if left <= 0:
            what = message or _name(condition)
            last = bounded_repr(value)
            raise AssertionError(
                f"condition not met within {timeout} s: {what} (last returned {last})"
            )
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
            message names ``message``, or the condition's ``__name__`` (and
            where a lambda was written), and what it last returned.
        TypeError: if ``condition`` is not callable, or returns an awaitable
            (an ``async def`` condition: its coroutine is always true), or
            ``timeout`` or ``interval`` is not a number of seconds.
        ValueError: if ``timeout`` or ``interval`` is not finite and > 0.
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
        AssertionError: if the condition is still false at the deadline
            (called on a thread running an event loop, such as an async
            test's, it says that the loop, and its actors, were blocked).
        TypeError: as ``await_condition``.
        ValueError: if ``timeout`` or ``interval`` is not finite and > 0.
        Exception: whatever ``condition`` raises, at once.
    """
    try:
        for pause in _pauses(condition, timeout, interval, message):
            time.sleep(pause)
    except AssertionError as failure:
        if not _on_a_running_loop():
            raise
        raise AssertionError(
            f"{failure}; wait_until blocked this thread's running event loop, so nothing "
            "on it (actors included) could make the condition true: "
            "use `await await_condition(...)` in async code"
        ) from None


def _on_a_running_loop() -> bool:
    """Whether this thread is running an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
