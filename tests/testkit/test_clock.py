"""ManualClock.advance: a callback that keeps time from moving on is stopped
with a clear error, not run forever."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from atomr import Actor, ActorSystem, Props
from atomr.testkit import ManualClock
from atomr.testkit import clock as clock_module

LIMIT = 1000
"""The guard's limit in these tests (the default is 100 000: slow to reach)."""


@pytest.fixture(autouse=True)
def _limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clock_module, "MAX_CALLS_AT_ONE_TIME", LIMIT, raising=False)


@pytest.mark.parametrize("delay", [0.0, 1e-300], ids=["zero", "too small to move time"])
def test_advance_stops_a_callback_that_keeps_time_from_moving(delay: float) -> None:
    clock, ran = ManualClock(start=1.0), []

    def again() -> None:
        ran.append(clock.time())
        if len(ran) > 2 * LIMIT:
            raise AssertionError("advance never stopped it")  # was: it ran forever
        clock.call_later(delay, again)

    clock.call_later(0.5, again)
    with pytest.raises(RuntimeError, match=r"at time 1\.5 without time moving on"):
        clock.advance(1)
    assert len(ran) == LIMIT and set(ran) == {1.5}
    # as when a callback raises: time stays where it stuck, the rest stays scheduled
    assert clock.time() == 1.5 and clock.pending == 1


def test_many_callbacks_at_one_time_that_time_moves_past_all_run() -> None:
    clock, ran = ManualClock(), []
    for _ in range(3):
        clock.call_later(1, lambda: (ran.append(clock.time()), clock.call_later(0, ran.append, 0)))
    assert clock.advance(2) == 6 and len(ran) == 6 and clock.time() == 2.0


class Ticks(Actor):
    """Starts a repeating timer of ``interval`` seconds; ignores its ticks."""

    def __init__(self, interval: float) -> None:
        super().__init__()
        self.context.schedule_repeatedly(interval, "tick")

    def receive(self, message: object) -> object:
        return message


class CountingClock(ManualClock):
    """Fails a callback that schedules more than twice the limit (the hang)."""

    scheduled = 0

    def call_later(self, delay: float, callback: Callable[..., object], *args: Any) -> Any:
        self.scheduled += 1
        if self.scheduled > 2 * LIMIT:
            raise AssertionError("advance never stopped it")  # was: it ran forever
        return super().call_later(delay, callback, *args)


async def test_a_repeating_timer_too_fast_for_the_clock_is_stopped_by_advance() -> None:
    """An interval of 1e-12 s cannot move a float time of 10**6 on: the timer
    fell due again and again at one time, each tick queued, and advance hung."""
    clock = CountingClock(start=10.0**6)
    async with ActorSystem("clock", scheduler=clock) as system:
        ref = system.spawn(Props(Ticks, 1e-12))
        assert await ref.ask("started", timeout=5) == "started"
        with pytest.raises(RuntimeError, match="without time moving on"):
            clock.advance(1)
