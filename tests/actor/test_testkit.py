"""The testkit: TestProbe and the actor_system fixture."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
from typing import Any, Protocol

import numpy as np
import pytest

from atomr import Actor, ActorSystem, Directive, OneForOneStrategy, Props
from atomr.testkit import ChildFailed, ManualClock, TestProbe, expect_log

from .actors import Echo


async def test_fixture_gives_running_system(actor_system: ActorSystem) -> None:
    assert isinstance(actor_system, ActorSystem) and not actor_system.is_terminated
    assert actor_system.loop is asyncio.get_running_loop()


def test_the_pytest_plugin_loads_neither_numpy_nor_numba() -> None:
    """pytest loads the plugin in every run of an environment holding atomr:
    it must not bring the device and training stack along (numba's import,
    numpy's warning filters, half a second per run, and a broken numba
    would break every user's pytest)."""
    code = (
        "import sys, atomr.testkit.plugin, atomr.testkit\n"
        "print(sorted(m for m in ('numpy', 'numba', 'atomr.accel') if m in sys.modules))\n"
        "assert callable(atomr.testkit.slow_device)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"  # was: ['atomr.accel', 'numba', 'numpy']


async def test_a_probe_refuses_what_is_no_system_or_strategy(actor_system: ActorSystem) -> None:
    with pytest.raises(TypeError, match="system must be an ActorSystem"):
        TestProbe("system")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="supervisor_strategy must be a SupervisorStrategy"):
        TestProbe(actor_system, supervisor_strategy="restart")  # type: ignore[arg-type]
    assert not actor_system.actors  # nothing spawned


async def test_expect_msg(actor_system: ActorSystem) -> None:
    probe = TestProbe(actor_system)
    probe.ref.tell("a")
    assert await probe.expect_msg("a") == "a"
    probe.ref.tell("b")
    with pytest.raises(AssertionError, match="expected 'a', got 'b'"):
        await probe.expect_msg("a")
    with pytest.raises(AssertionError, match="timeout"):
        await probe.expect_msg(timeout=0.01)


async def test_expect_msg_compares_numpy_arrays_by_shape_and_elements(
    actor_system: ActorSystem,
) -> None:
    probe = TestProbe(actor_system)
    weights = np.array([1.0, 2.0])
    probe.ref.tell(weights.copy())
    assert await probe.expect_msg(weights) is not weights  # was: ValueError, truth value ambiguous
    for sent in (np.array([1.0, 3.0]), np.array([1.0, 2.0, 3.0]), [1.0, 2.0], np.ones((1, 2))):
        probe.ref.tell(sent)
        with pytest.raises(AssertionError, match="expected array"):
            await probe.expect_msg(weights)
    probe.ref.tell(np.float32(2.0))
    assert await probe.expect_msg(2.0) == 2.0  # a NumPy scalar equals its number
    probe.ref.tell((weights.copy(), "step"))
    with pytest.raises(TypeError, match="cannot compare .* numpy.testing"):
        await probe.expect_msg((weights, "step"))  # arrays inside a tuple: no answer from ==


async def test_expect_no_msg(actor_system: ActorSystem) -> None:
    probe = TestProbe(actor_system)
    await probe.expect_no_msg(0.01)
    probe.ref.tell("x")
    with pytest.raises(AssertionError, match="got 'x'"):
        await probe.expect_no_msg(0.05)


async def test_receive_n(actor_system: ActorSystem) -> None:
    probe = TestProbe(actor_system)
    for i in range(3):
        probe.ref.tell(i)
    assert await probe.receive_n(3) == [0, 1, 2]
    probe.ref.tell(3)
    with pytest.raises(AssertionError, match="message 2 of 2"):
        await probe.receive_n(2, timeout=0.05)


async def test_probe_answers_asks(actor_system: ActorSystem) -> None:
    probe = TestProbe(actor_system)
    pending = asyncio.ensure_future(probe.ref.ask("question", timeout=1))
    assert await probe.expect_msg("question") == "question"
    assert probe.reply(42)
    assert await pending == 42


async def test_watch_and_expect_terminated(actor_system: ActorSystem) -> None:
    probe = TestProbe(actor_system)
    ref = probe.watch(actor_system.spawn(Props(Echo)))
    ref.stop()
    await probe.expect_terminated(ref)


async def test_last_sender_is_the_sender_of_the_last_message(actor_system: ActorSystem) -> None:
    probe, other = TestProbe(actor_system), TestProbe(actor_system)
    probe.ref.tell("hi", sender=other.ref)
    await probe.expect_msg("hi")
    assert probe.last_sender is other.ref
    probe.last_sender.tell("back")
    await other.expect_msg("back")
    probe.ref.tell("anonymous")
    await probe.expect_msg("anonymous")
    assert probe.last_sender is None


async def test_fish_for_message_skips_until_the_predicate_accepts(
    actor_system: ActorSystem,
) -> None:
    probe = TestProbe(actor_system)
    for message in ("noise", 1, "noise", 2):
        probe.ref.tell(message)
    assert await probe.fish_for_message(lambda m: isinstance(m, int)) == 1
    assert await probe.fish_for_message(lambda m: m == 2) == 2
    with pytest.raises(AssertionError, match=r"skipped 1 message"):
        probe.ref.tell("more noise")
        await probe.fish_for_message(lambda m: m == 3, timeout=0.05)


async def test_a_fish_past_its_deadline_fails_as_a_timeout(actor_system: ActorSystem) -> None:
    probe = TestProbe(actor_system)
    probe.ref.tell("a")

    def slow_no(message: object) -> bool:
        time.sleep(0.1)  # a slow predicate, the scenario: the deadline passes inside it
        return False

    with pytest.raises(AssertionError, match=r"timeout \(0 s\) waiting for a fish \(skipped 1"):
        await probe.fish_for_message(slow_no, timeout=0.05)  # was: ValueError, timeout 0.0


async def test_a_message_already_queued_is_taken_with_no_time_left(
    actor_system: ActorSystem,
) -> None:
    probe = TestProbe(actor_system)
    probe.ref.tell("a")
    probe.ref.tell("b")  # the probe actor queues both in one turn

    def slow_on_a(message: object) -> bool:
        if message == "a":
            time.sleep(0.1)  # a slow predicate, the scenario: the deadline passes inside it
        return message == "b"

    assert await probe.fish_for_message(slow_on_a, timeout=0.05) == "b"  # was: a timeout


async def test_ignore_msg_drops_matching_messages(actor_system: ActorSystem) -> None:
    probe = TestProbe(actor_system)
    probe.ignore_msg(lambda m: m == "tick")
    for message in ("tick", "a", "tick", "b"):
        probe.ref.tell(message)
    assert await probe.receive_n(2) == ["a", "b"]
    probe.ignore_msg(None)
    probe.ref.tell("tick")
    await probe.expect_msg("tick")


async def test_a_message_the_ignore_predicate_raises_on_is_reported_not_lost(
    actor_system: ActorSystem,
) -> None:
    probe = TestProbe(actor_system)
    probe.ignore_msg(lambda m: m.startswith("tick"))
    for message in (42, "tick", "hello", 7):
        probe.ref.tell(message)
    with pytest.raises(AssertionError, match="predicate raised AttributeError.* on 42"):
        await probe.expect_msg()  # was: 42 lost, the probe actor restarted, a timeout
    assert await probe.expect_msg("hello") == "hello"
    with pytest.raises(AssertionError, match="on 7"):
        await probe.expect_no_msg(1.0)
    with pytest.raises(TypeError, match="predicate must be a function"):
        probe.ignore_msg("tick")  # type: ignore[arg-type]


async def test_within_bounds_every_wait_inside_it(actor_system: ActorSystem) -> None:
    probe = TestProbe(actor_system)
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(AssertionError, match="timeout"):
        async with probe.within(0.05):
            await probe.expect_msg(timeout=30)  # cut to what is left of 0.05 s
    assert loop.time() - start < 10  # not the 30 s the call asked for
    probe.ref.tell("quick")
    async with probe.within(5):
        await probe.expect_msg("quick")
    with pytest.raises(AssertionError, match="less than within's min"):
        async with probe.within(10, min=5):
            pass
    with pytest.raises(ValueError):
        async with probe.within(1, min=2):
            pass


async def test_within_fails_a_block_that_overruns_its_max(actor_system: ActorSystem) -> None:
    probe = TestProbe(actor_system)
    with pytest.raises(AssertionError, match="more than within's max"):
        async with probe.within(0.01):
            await asyncio.sleep(0.02)  # the overrun under test (no probe wait to cut)


async def test_expect_log_counts_matching_records(actor_system: ActorSystem) -> None:
    ref = actor_system.spawn(Props(Echo), name="fragile")
    async with expect_log(r"fragile \(Echo\) failed", level="WARNING") as records:
        ref.tell(ValueError("bad"))
    assert records[0].levelname == "WARNING"
    with pytest.raises(AssertionError, match="expected 1 log record"):
        async with expect_log("never logged", timeout=0.05):
            pass
    with pytest.raises(AssertionError, match="expected 0 log record"):
        async with expect_log("fragile", count=0):
            ref.tell(ValueError("again"))
            await ref.ask("sync")
    with pytest.raises(ValueError):
        async with expect_log(level="LOUD"):
            pass


async def test_expect_log_refuses_an_endless_timeout_before_changing_the_logger() -> None:
    logger = logging.getLogger("atomr")
    level, handlers = logger.level, list(logger.handlers)

    async def never_logged() -> None:
        async with expect_log("never logged", level="DEBUG", timeout=float("inf")):
            pass

    with pytest.raises(ValueError, match="timeout must be a finite number"):
        await asyncio.wait_for(never_logged(), 5)  # was: a wait with no end (5 s: a hang)
    assert (logger.level, logger.handlers) == (level, handlers)


async def test_counts_and_durations_are_checked_not_taken_by_their_truth(
    actor_system: ActorSystem,
) -> None:
    probe = TestProbe(actor_system)
    probe.ref.tell("only one")
    with pytest.raises(TypeError, match="n must be an int"):
        await probe.receive_n(True)  # type: ignore[arg-type]  # was: one message
    with pytest.raises(ValueError, match="max"):
        async with probe.within(float("nan")):  # was: a block that could never fail
            pass
    with pytest.raises(TypeError, match="max"):
        async with probe.within(True):  # type: ignore[arg-type]
            pass
    with pytest.raises(TypeError, match="count must be an int"):
        async with expect_log("x", count=True):  # type: ignore[arg-type]
            pass
    with pytest.raises(ValueError, match="timeout"):
        async with expect_log("x", timeout=float("nan")):
            pass
    with pytest.raises(TypeError, match="level must be an int"):
        async with expect_log("x", level=True):  # type: ignore[arg-type]  # was: DEBUG and up
            pass
    assert await probe.receive_n(1) == ["only one"]  # the refusals took nothing


async def test_a_probe_wait_always_ends_and_a_refused_one_takes_nothing(
    actor_system: ActorSystem,
) -> None:
    probe = TestProbe(actor_system)
    probe.ref.tell("kept")
    for wait in (probe.expect_no_msg(float("inf")), probe.expect_msg("x", timeout=float("inf"))):
        with pytest.raises(ValueError, match="finite"):  # was: a wait with no end
            await asyncio.wait_for(wait, 5)
    with pytest.raises(TypeError, match="cls must be a class"):
        await probe.expect_msg_type("str")  # type: ignore[arg-type]  # was: took 'kept', then failed
    assert await probe.expect_msg_type(str) == "kept"


class Speaks(Protocol):
    """Not runtime_checkable: isinstance refuses it."""

    def speak(self) -> str: ...


async def test_a_refused_fish_type_check_or_terminated_takes_no_message(
    actor_system: ActorSystem,
) -> None:
    probe = TestProbe(actor_system)
    probe.ref.tell("kept")
    with pytest.raises(TypeError, match="predicate must be a function, got 'kept'"):
        await probe.fish_for_message("kept")  # type: ignore[arg-type]  # was: took 'kept'
    with pytest.raises(TypeError, match="Speaks cannot be checked by isinstance"):
        await probe.expect_msg_type(Speaks)  # type: ignore[type-abstract]  # was: took 'kept'
    with pytest.raises(TypeError, match="ref must be an ActorRef, got 'counter'"):
        await probe.expect_terminated("counter")  # type: ignore[arg-type]  # was: took 'kept'
    assert await probe.expect_msg("kept") == "kept"


class ChildOfProbe(Actor):
    """Tells its parent hello; raises what it is sent."""

    def pre_start(self) -> None:
        parent = self.context.parent
        assert parent is not None
        parent.tell(("hello", self.context.self_ref.name))

    def receive(self, message: Any) -> Any:
        if isinstance(message, BaseException):
            raise message
        return message


async def test_probe_as_parent_and_supervisor(actor_system: ActorSystem) -> None:
    def decider(error: BaseException) -> Directive:
        return Directive.STOP if isinstance(error, KeyError) else Directive.RESTART

    probe = TestProbe(actor_system, supervisor_strategy=OneForOneStrategy(decider=decider))
    child = probe.watch(probe.spawn_child(Props(ChildOfProbe), name="kid"))
    assert child.path == f"{probe.ref.path}/kid"
    await probe.expect_msg(("hello", "kid"))
    child.tell(RuntimeError("restart"))
    failed = await probe.expect_msg_type(ChildFailed)
    assert failed.child is child and failed.directive is Directive.RESTART
    assert isinstance(failed.error, RuntimeError)
    await probe.expect_msg(("hello", "kid"))  # restarted: pre_start again
    child.tell(KeyError("stop"))
    assert (await probe.expect_msg_type(ChildFailed)).directive is Directive.STOP
    await probe.expect_terminated(child)


async def test_manual_clock_runs_due_callbacks_in_time_order() -> None:
    clock = ManualClock(start=10.0)
    ran: list[tuple[float, str]] = []
    clock.call_later(2, lambda: ran.append((clock.time(), "b")))
    clock.call_later(1, lambda: ran.append((clock.time(), "a")))
    dropped = clock.call_later(1.5, lambda: ran.append((clock.time(), "x")))
    dropped.cancel()
    assert clock.pending == 2
    assert clock.advance(0.5) == 0 and clock.time() == 10.5
    assert clock.advance(5) == 2
    assert ran == [(11.0, "a"), (12.0, "b")] and clock.time() == 15.5
    with pytest.raises(ValueError):
        clock.advance(-1)


def test_manual_clock_refuses_to_advance_forever() -> None:
    # a repeating timer falls due once per interval: an infinite advance never returned
    clock = ManualClock()
    ticks: list[float] = []

    def tick() -> None:
        ticks.append(clock.time())
        if len(ticks) > 1000:
            raise RuntimeError("advance(inf) never ends")
        clock.call_later(0.1, tick)

    clock.call_later(0.1, tick)
    with pytest.raises(ValueError, match="finite"):
        clock.advance(float("inf"))
    assert ticks == [] and clock.time() == 0.0


@pytest.mark.parametrize(
    ("start", "error"),
    [(True, TypeError), ("5", TypeError), (float("nan"), ValueError), (float("inf"), ValueError)],
)
def test_manual_clock_refuses_a_start_at_which_nothing_would_fall_due(
    start: object, error: type[Exception]
) -> None:
    with pytest.raises(error, match="start"):
        ManualClock(start)  # type: ignore[arg-type]  # nan was taken: no timer ever fired
    assert ManualClock(np.float32(2.5)).time() == 2.5


def test_manual_clock_refuses_a_callback_that_is_not_callable() -> None:
    clock = ManualClock()
    with pytest.raises(TypeError, match="callback must be callable, got None"):
        clock.call_later(1, None)  # type: ignore[arg-type]  # was: scheduled; advance raised
    assert clock.pending == 0 and clock.advance(2) == 0


def test_a_callback_that_raises_stops_advance_where_it_was_due() -> None:
    clock, ran = ManualClock(), []

    def boom() -> None:
        raise KeyError("boom")

    clock.call_later(1, ran.append, 1)
    clock.call_later(2, boom)
    clock.call_later(3, ran.append, 3)
    with pytest.raises(KeyError):
        clock.advance(5)
    assert (clock.time(), ran, clock.pending) == (2.0, [1], 1)
    assert clock.advance(5) == 1 and ran == [1, 3] and clock.time() == 7.0
