"""await_condition and wait_until: return when the condition holds, fail at
the deadline, refuse bad arguments, and let the loop run while waiting."""

from __future__ import annotations

import asyncio
import sys
import threading
import time

import numpy as np
import pytest

from atomr import ActorSystem, Props
from atomr.testkit import await_condition, wait_until
from tests.actor.actors import Echo


async def test_await_condition_returns_once_the_loop_makes_it_true() -> None:
    flag: list[bool] = []
    asyncio.get_running_loop().call_later(0.05, flag.append, True)
    started = time.monotonic()
    await await_condition(lambda: bool(flag), timeout=5)
    assert 0.04 <= time.monotonic() - started < 4  # woke for it, not at the deadline


async def test_actors_keep_running_while_a_test_waits(actor_system: ActorSystem) -> None:
    answers: list[object] = []
    ref = actor_system.spawn(Props(Echo))
    task = asyncio.ensure_future(ref.ask("hi", timeout=5))
    task.add_done_callback(lambda t: answers.append(t.result()))
    await await_condition(lambda: answers == ["hi"], timeout=5)


async def test_await_condition_fails_at_the_deadline_naming_what_it_waited_for() -> None:
    started = time.monotonic()
    with pytest.raises(AssertionError, match=r"within 0.1 s: the door opened"):
        await await_condition(lambda: False, timeout=0.1, message="the door opened")
    assert 0.1 <= time.monotonic() - started < 2

    def never() -> bool:
        return False

    with pytest.raises(AssertionError, match="never"):
        await await_condition(never, timeout=0.02)


async def test_a_condition_that_raises_fails_at_once() -> None:
    def broken() -> bool:
        raise KeyError("no such thing")

    with pytest.raises(KeyError):
        await await_condition(broken, timeout=60)


async def test_an_async_condition_is_refused_not_passed_unchecked() -> None:
    async def never() -> bool:
        return False

    with pytest.raises(TypeError, match="never returned an awaitable"):
        await await_condition(never, timeout=0.05)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="awaitable"):
        wait_until(never, timeout=0.05)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be a function"):
        await await_condition(False, timeout=0.05)  # type: ignore[arg-type]


async def test_the_failure_says_where_a_lambda_was_written_and_what_it_returned() -> None:
    line = sys._getframe().f_lineno + 2
    with pytest.raises(AssertionError) as failed:
        await await_condition(lambda: [], timeout=0.02)
    assert f"<lambda> at {__file__}:{line}" in str(failed.value)
    assert "last returned []" in str(failed.value)


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        (0, ValueError),
        (-1, ValueError),
        (float("nan"), ValueError),
        (float("inf"), ValueError),
        ("1", TypeError),
        (True, TypeError),
        (None, TypeError),
    ],
)
async def test_bad_timeout_or_interval_is_refused(bad: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="timeout"):
        await await_condition(lambda: True, timeout=bad)  # type: ignore[arg-type]
    with pytest.raises(error, match="interval"):
        wait_until(lambda: True, interval=bad)  # type: ignore[arg-type]


async def test_numpy_seconds_are_seconds() -> None:
    await await_condition(lambda: True, timeout=np.float32(0.5), interval=np.int64(1))
    wait_until(lambda: True, timeout=np.float32(0.5))


async def test_wait_until_on_a_running_loop_says_it_blocked_the_loop() -> None:
    flag: list[bool] = []
    asyncio.get_running_loop().call_soon(flag.append, True)  # never runs while blocked
    with pytest.raises(AssertionError, match="blocked this thread's running event loop"):
        wait_until(lambda: bool(flag), timeout=0.05)
    await await_condition(lambda: bool(flag), timeout=5)  # what to use instead


def test_wait_until_returns_when_another_thread_sets_it() -> None:
    event = threading.Event()
    threading.Timer(0.05, event.set).start()
    wait_until(event.is_set, timeout=5)
    assert event.is_set()
    with pytest.raises(AssertionError, match="within 0.05 s"):
        wait_until(lambda: False, timeout=0.05)
