"""Every wait has a deadline or an explicit None.

``WAITS`` is the table of every waiting API of ``atomr.actor`` and
``atomr.testkit``: what ends it, and a scenario in which nothing else would
(no answer, no room, a stuck actor). Each scenario must end by that deadline,
with that error. A new waiting API without a row fails
``test_the_table_lists_every_waiting_api``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

import atomr.actor
import atomr.testkit
from atomr import (
    Actor,
    ActorSystem,
    AskTimeoutError,
    BoundedMailbox,
    MailboxFullError,
    OverflowPolicy,
    Props,
)
from atomr.testkit import TestProbe, await_condition, expect_log

from .actors import Echo


class Silent(Actor):
    """Never answers, and holds every message it gets."""

    async def receive(self, message: Any) -> None:
        await asyncio.Event().wait()


class StuckStop(Actor):
    async def post_stop(self) -> None:
        await asyncio.Event().wait()

    def receive(self, message: Any) -> Any:
        return message


def _full(system: ActorSystem) -> Any:
    """A BACK_PRESSURE actor whose mailbox stays full."""
    mailbox = BoundedMailbox(1, OverflowPolicy.BACK_PRESSURE)
    ref = system.spawn(Props(Silent).with_mailbox(mailbox))
    ref.tell("in hand")
    return ref


async def _ask(system: ActorSystem) -> None:
    await system.spawn(Props(Silent)).ask("x", timeout=0.05)


async def _ask_back_pressure(system: ActorSystem) -> None:
    ref = _full(system)
    await asyncio.sleep(0)  # "in hand" is taken: one more fills the mailbox
    ref.tell("queued")
    await ref.ask("x", timeout=0.05)


async def _send(system: ActorSystem) -> None:
    ref = _full(system)
    await asyncio.sleep(0)
    ref.tell("queued")
    await ref.send("x", timeout=0.05)


async def _terminate(system: ActorSystem) -> None:
    system.spawn(Props(StuckStop))
    await system.terminate(timeout=0.05)


async def _async_with(system: ActorSystem) -> None:
    async with ActorSystem("w", terminate_timeout=0.05) as other:
        other.spawn(Props(StuckStop))


async def _stop_future(system: ActorSystem) -> None:
    ref = system.spawn(Props(StuckStop))
    stopped = ref.stop()
    with contextlib.suppress(TimeoutError):
        await system.terminate(timeout=0.05)
    await stopped  # ends: terminate gave up on the actor


async def _probe(method: str, system: ActorSystem, *args: Any) -> None:
    probe = TestProbe(system)
    await getattr(probe, method)(*args)


async def _expect_no_msg(system: ActorSystem) -> None:
    await TestProbe(system).expect_no_msg(0.05)


async def _within(system: ActorSystem) -> None:
    probe = TestProbe(system)
    async with probe.within(0.05):
        await probe.expect_msg(timeout=60)  # cut to within's max


async def _expect_log(system: ActorSystem) -> None:
    async with expect_log("never logged", timeout=0.05):
        pass


async def _await_condition(system: ActorSystem) -> None:
    await await_condition(lambda: False, timeout=0.05)


@dataclass(frozen=True)
class Wait:
    api: str
    ended_by: str
    scenario: Callable[[ActorSystem], Awaitable[None]]
    raises: type[BaseException] | None
    """What the scenario ends with (None: it returns)."""


WAITS = [
    Wait(
        "ActorRef.ask",
        "the reply, the actor stopping, or timeout= (default 60 s; None: no deadline), counted from the call",
        _ask,
        AskTimeoutError,
    ),
    Wait(
        "ActorRef.ask",
        "... time spent waiting for room in a BACK_PRESSURE mailbox included",
        _ask_back_pressure,
        AskTimeoutError,
    ),
    Wait(
        "ActorRef.send",
        "room in the mailbox, the actor stopping, or timeout= (default 60 s; None)",
        _send,
        MailboxFullError,
    ),
    Wait(
        "Mailbox.wait_for_room",
        "awaited only inside send / ask: their deadline, or the actor stopping",
        _send,
        MailboxFullError,
    ),
    Wait(
        "ActorSystem.terminate",
        "every actor stopped, or timeout= (default 60 s; None): stuck ones abandoned",
        _terminate,
        TimeoutError,
    ),
    Wait(
        "ActorSystem.__aexit__",
        "terminate(terminate_timeout=) of the constructor (default 60 s; None)",
        _async_with,
        TimeoutError,
    ),
    Wait(
        "ActorRef.stop",
        "a future: the actor stopped, or terminate's deadline abandoned it",
        _stop_future,
        None,
    ),
    Wait(
        "TestProbe.expect_msg",
        "a message, or timeout= (3 s), or an enclosing within",
        lambda s: _probe("expect_msg", s, "x", 0.05),
        AssertionError,
    ),
    Wait(
        "TestProbe.expect_msg_type",
        "as expect_msg",
        lambda s: _probe("expect_msg_type", s, int, 0.05),
        AssertionError,
    ),
    Wait(
        "TestProbe.receive_n",
        "n messages, or timeout= for all",
        lambda s: _probe("receive_n", s, 2, 0.05),
        AssertionError,
    ),
    Wait(
        "TestProbe.fish_for_message",
        "an accepted message, or timeout= for all",
        lambda s: _probe("fish_for_message", s, bool, 0.05),
        AssertionError,
    ),
    Wait(
        "TestProbe.expect_terminated",
        "as expect_msg",
        lambda s: _probe("expect_terminated", s, s.spawn(Props(Echo)), 0.05),
        AssertionError,
    ),
    Wait("TestProbe.expect_no_msg", "its duration (or an enclosing within)", _expect_no_msg, None),
    Wait(
        "TestProbe.within", "its max: every probe wait inside ends by then", _within, AssertionError
    ),
    Wait("expect_log", "count records, or timeout= (3 s)", _expect_log, AssertionError),
    Wait("await_condition", "the condition, or timeout= (3 s)", _await_condition, AssertionError),
]


@pytest.mark.parametrize("wait", WAITS, ids=[f"{w.api}-{i}" for i, w in enumerate(WAITS)])
async def test_each_wait_ends_by_its_deadline(wait: Wait, actor_system: ActorSystem) -> None:
    ended = asyncio.wait_for(wait.scenario(actor_system), 10)  # 10 s: a hang, not a deadline
    if wait.raises is None:
        await ended
    else:
        with pytest.raises(wait.raises):
            await ended


NOT_WAITING = {"ActorSystem.__aenter__"}  # binds the loop and returns


def _waiting_apis() -> set[str]:
    """Public coroutines, async context managers and future-returning methods."""
    found = set()
    for module in (atomr.actor, atomr.testkit):
        for name in module.__all__:
            obj = getattr(module, name)
            members = vars(obj).items() if inspect.isclass(obj) else [("", obj)]
            for attr, value in members:
                if attr.startswith("_") and attr not in ("__aenter__", "__aexit__"):
                    continue
                func = getattr(value, "__func__", value)
                wrapped = getattr(func, "__wrapped__", None)
                returns = str(getattr(func, "__annotations__", {}).get("return", ""))
                if (
                    inspect.iscoroutinefunction(func)
                    or inspect.isasyncgenfunction(wrapped)
                    or "Future" in returns
                ):
                    found.add(f"{name}.{attr}" if attr else name)
    return found


def test_the_table_lists_every_waiting_api() -> None:
    assert _waiting_apis() - NOT_WAITING == {w.api for w in WAITS}


@pytest.mark.parametrize("bounded", [False, True])
async def test_an_asked_poison_pill_is_answered_when_the_actor_stops(bounded: bool) -> None:
    """The pill stops the actor without a reply of its own: the ask ends
    with ActorStoppedError at once, not at (or past) its deadline."""
    props = Props(Silent)
    if bounded:
        props = props.with_mailbox(BoundedMailbox(4))
    async with ActorSystem("waits") as system:
        ref = system.spawn(props)
        started = asyncio.get_running_loop().time()
        with pytest.raises(atomr.actor.ActorStoppedError):
            await ref.ask(atomr.actor.PoisonPill(), timeout=30)
        assert asyncio.get_running_loop().time() - started < 10  # not the 30 s deadline
        assert not ref.is_alive


class SlowToStop(Actor):
    def __init__(self, release: asyncio.Event) -> None:
        super().__init__()
        self.release = release

    def receive(self, message: Any) -> Any:
        return message

    async def post_stop(self) -> None:
        await self.release.wait()


async def test_giving_up_on_a_stop_cancels_only_that_wait() -> None:
    """`wait_for(ref.stop(), t)` timing out must not cancel the actor's own
    stop: a later `stop()` and `terminate` still wait for `post_stop`."""
    release = asyncio.Event()
    async with ActorSystem("waits") as system:
        ref = system.spawn(Props(SlowToStop, release))
        assert await ref.ask(1) == 1
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(ref.stop(), 0.05)
        second = asyncio.ensure_future(ref.stop())
        await asyncio.sleep(0)  # the second wait has begun; nothing ends it but post_stop
        assert not second.done()
        release.set()
        await asyncio.wait_for(second, 10)
        assert not ref.is_alive


class ForwardsThenStops(Actor):
    def __init__(self, target: Any) -> None:
        super().__init__()
        self.target = target

    def receive(self, message: Any) -> None:
        self.context.forward(self.target)
        self.context.stop(self.context.self_ref)


async def test_a_forwarded_ask_keeps_its_deadline_when_the_forwarder_stops() -> None:
    async with ActorSystem("waits") as system:
        silent = system.spawn(Props(Silent))
        forwarder = system.spawn(Props(ForwardsThenStops, silent))
        started = asyncio.get_running_loop().time()
        with pytest.raises(AskTimeoutError):
            await forwarder.ask("x", timeout=0.2)  # was: no end (the deadline was dropped)
        assert asyncio.get_running_loop().time() - started < 5


HUGE = 10**400  # an int no float holds


async def test_an_int_too_large_for_a_float_is_a_clear_value_error() -> None:
    async with ActorSystem("waits") as system:
        ref = system.spawn(Props(Silent))
        probe = TestProbe(system)
        waits: list[Callable[[], Any]] = [
            lambda: ref.ask(1, timeout=HUGE),
            lambda: system.schedule_once(HUGE, ref, 1),
            lambda: probe.expect_msg(timeout=HUGE),
            lambda: atomr.actor.OneForOneStrategy(within=HUGE),
        ]
        for wait in waits:
            with pytest.raises(ValueError, match="is too large: 1000"):
                result = wait()
                if inspect.isawaitable(result):
                    await result
        with pytest.raises(ValueError, match="must be > 0 seconds or None, got -1000"):
            await ref.ask(1, timeout=-HUGE)  # its message stays short
        with pytest.raises(ValueError, match="timeout is too large"):
            await system.terminate(timeout=HUGE)


@pytest.mark.parametrize("timeout", [float("nan"), 0, -1, "1", True])
async def test_a_probe_refuses_a_timeout_that_is_no_duration(timeout: Any) -> None:
    async with ActorSystem("waits") as system:
        probe = TestProbe(system)
        with pytest.raises((TypeError, ValueError), match="timeout must be"):
            await asyncio.wait_for(probe.expect_msg(timeout=timeout), 5)  # NaN used to hang


async def test_strategy_and_schedule_arguments_are_checked() -> None:
    with pytest.raises(TypeError, match="max_restarts must be an int"):
        atomr.actor.OneForOneStrategy(max_restarts=True)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="within must be a number of seconds"):
        atomr.actor.OneForOneStrategy(within="1")  # type: ignore[arg-type]
    async with ActorSystem("waits") as system:
        with pytest.raises(TypeError, match="schedule_once\\(\\) takes an ActorRef, got str"):
            system.schedule_once(1.0, "not-a-ref", "m")  # type: ignore[arg-type]


async def test_numpy_scalars_are_numbers_of_seconds() -> None:
    """As `atomr._arguments` rules, NumPy's scalars are numbers: an ask's
    timeout, a strategy's window, a timer's delay and a probe's wait take
    them (each was a TypeError, though `np.float64`, a float, was taken)."""
    async with ActorSystem("waits") as system:
        ref = system.spawn(Props(Echo))
        assert await ref.ask("hi", timeout=np.float32(5)) == "hi"
        await ref.send("sent", timeout=np.int64(5))
        atomr.actor.OneForOneStrategy(within=np.int64(60))
        probe = TestProbe(system)
        system.schedule_once(np.float32(0), probe.ref, "tick")
        assert await probe.expect_msg("tick", timeout=np.float32(5)) == "tick"
