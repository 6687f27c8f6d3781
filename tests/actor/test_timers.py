"""Timers: schedule_once, schedule_repeatedly, keys, cancellation, receive timeout.

They run on a ``ManualClock``: time moves only when the test advances it, and
``advance`` queues the due ticks at once, so a test can act while a tick
waits in the mailbox.
"""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import AsyncIterator
from typing import Any

import pytest

from atomr import (
    Actor,
    ActorRef,
    ActorSystem,
    BoundedMailbox,
    Cancellable,
    OverflowPolicy,
    Props,
    ReceiveTimeout,
)
from atomr.testkit import ManualClock, TestProbe


class Scheduler(Actor):
    """Runs timer commands and answers with their result (a ``Cancellable``);
    tells ``probe`` every other message as ``(incarnation, message)``.

    ``("hold", gate, command)`` waits for ``gate`` inside the handler, then
    runs ``command``: ticks can queue up behind it meanwhile.
    """

    def __init__(self, probe: ActorRef, incarnations: list[int]) -> None:
        super().__init__()
        self.probe = probe
        self.incarnation = len(incarnations)
        incarnations.append(self.incarnation)

    async def receive(self, message: Any) -> Any:
        if isinstance(message, ReceiveTimeout):
            self.probe.tell("timeout")
            return None
        if not isinstance(message, tuple):
            self.probe.tell((self.incarnation, message))
            return None
        if message[0] == "hold":
            _, gate, command = message
            self.probe.tell("holding")
            await gate
            return self.run(command)
        return self.run(message)

    def run(self, command: tuple[Any, ...]) -> Any:
        ctx = self.context
        kind, *args = command
        if kind == "once":
            key = args[2] if len(args) > 2 else None
            return ctx.schedule_once(args[0], args[1], key=key)
        if kind == "every":
            return ctx.schedule_repeatedly(args[0], args[1])
        if kind == "cancel key":
            return ctx.cancel_timer(args[0])
        if kind == "timeout":
            return ctx.set_receive_timeout(args[0])
        if kind == "fail":
            raise RuntimeError("restart me")
        return None  # ("sync",): everything queued before it was handled


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
async def system(clock: ManualClock) -> AsyncIterator[ActorSystem]:
    system = ActorSystem("timers", scheduler=clock)
    try:
        yield system
    finally:
        await system.terminate(timeout=10)


@pytest.fixture
def incarnations() -> list[int]:
    return []


@pytest.fixture
async def probe(system: ActorSystem) -> TestProbe:
    return TestProbe(system)


@pytest.fixture
async def ref(system: ActorSystem, probe: TestProbe, incarnations: list[int]) -> ActorRef:
    return system.spawn(Props(Scheduler, probe.ref, incarnations))


async def quiet(ref: ActorRef, probe: TestProbe) -> None:
    """Assert the actor received nothing more: it has handled all it had once
    it answers ("sync",), and it tells the probe before that answer."""
    await ref.ask(("sync",))
    await probe.expect_no_msg(0.01)


async def test_schedule_once_fires_once(
    clock: ManualClock, ref: ActorRef, probe: TestProbe
) -> None:
    await ref.ask(("once", 0.5, "tick"))
    assert clock.advance(0.4) == 0
    assert clock.advance(0.1) == 1
    await probe.expect_msg((0, "tick"))
    assert clock.advance(10) == 0
    await quiet(ref, probe)


async def test_schedule_repeatedly_fires_every_interval(
    clock: ManualClock, ref: ActorRef, probe: TestProbe
) -> None:
    timer = await ref.ask(("every", 0.1, "beat"))
    assert clock.advance(0.35) == 3
    assert await probe.receive_n(3) == [(0, "beat")] * 3
    assert timer.active and timer.cancel() and not timer.active
    assert clock.advance(1) == 0
    await quiet(ref, probe)


async def test_cancelled_before_firing(clock: ManualClock, ref: ActorRef, probe: TestProbe) -> None:
    timer = await ref.ask(("once", 0.2, "tick"))
    assert timer.active and not timer.cancelled
    assert timer.cancel() is True
    assert timer.cancelled and not timer.active
    assert timer.cancel() is False  # already cancelled
    assert clock.advance(1) == 0
    await quiet(ref, probe)


async def test_a_tick_already_queued_is_not_received_after_cancel(
    clock: ManualClock, ref: ActorRef, probe: TestProbe
) -> None:
    once: Cancellable = await ref.ask(("once", 0.1, "tick"))
    every: Cancellable = await ref.ask(("every", 0.1, "beat"))
    assert clock.advance(0.35) == 4  # "tick" and three beats wait in the mailbox
    assert once.cancel() is True and once.cancelled
    assert every.cancel() is True and every.cancelled
    await quiet(ref, probe)


async def test_a_received_one_shot_is_not_cancelled_by_cancel(
    clock: ManualClock, ref: ActorRef, probe: TestProbe
) -> None:
    timer: Cancellable = await ref.ask(("once", 0.1, "tick"))
    clock.advance(0.1)
    await probe.expect_msg((0, "tick"))
    assert not timer.active
    assert timer.cancel() is False  # Akka: cancel() of a timer that already fired
    assert not timer.cancelled


async def test_a_replaced_timer_is_not_received(
    clock: ManualClock, ref: ActorRef, probe: TestProbe
) -> None:
    await ref.ask(("once", 0.1, "old", "key"))
    gate = asyncio.get_running_loop().create_future()
    ref.tell(("hold", gate, ("once", 0.5, "new", "key")))
    await probe.expect_msg("holding")
    assert clock.advance(0.1) == 1  # "old" is queued behind the handler
    gate.set_result(None)  # which now replaces the timer of "key"
    await quiet(ref, probe)
    assert clock.advance(0.5) == 1
    await probe.expect_msg((0, "new"))


class Payload:
    """A message a weak reference can follow."""


async def test_a_received_keyed_one_shot_is_freed(
    clock: ManualClock, ref: ActorRef, probe: TestProbe
) -> None:
    """A key per request (a request's own deadline, as with Akka's timers) does
    not pile up: once its message is received, a one-shot timer is forgotten,
    message and all (it was kept until its key was used again, or forever)."""
    payload = Payload()
    freed = weakref.ref(payload)
    await ref.ask(("once", 0.1, payload, ("request", 1)))
    del payload
    clock.advance(0.1)
    assert (await probe.expect_msg())[1] is freed()
    await quiet(ref, probe)
    gc.collect()
    assert freed() is None
    assert await ref.ask(("cancel key", ("request", 1))) is False


async def test_cancel_timer_takes_back_a_fired_one_shot_still_queued(
    clock: ManualClock, ref: ActorRef, probe: TestProbe
) -> None:
    await ref.ask(("once", 0.1, "tick", "k"))
    gate = asyncio.get_running_loop().create_future()
    ref.tell(("hold", gate, ("cancel key", "k")))
    await probe.expect_msg("holding")
    assert clock.advance(0.1) == 1  # "tick" is queued behind the handler
    gate.set_result(None)
    await quiet(ref, probe)  # taken back by cancel_timer("k"): never received


async def test_cancel_timer_by_key(clock: ManualClock, ref: ActorRef, probe: TestProbe) -> None:
    await ref.ask(("once", 0.1, "tick", "k"))
    assert await ref.ask(("cancel key", "k")) is True
    assert await ref.ask(("cancel key", "k")) is False
    assert clock.advance(1) == 0
    await quiet(ref, probe)


async def test_a_restarted_actor_never_receives_the_old_incarnation_ticks(
    clock: ManualClock, ref: ActorRef, probe: TestProbe, incarnations: list[int]
) -> None:
    await ref.ask(("every", 0.1, "beat"))
    await ref.ask(("once", 0.1, "tick"))
    gate = asyncio.get_running_loop().create_future()
    ref.tell(("hold", gate, ("fail",)))
    await probe.expect_msg("holding")
    assert clock.advance(0.35) == 4  # queued behind the handler that will fail
    gate.set_result(None)
    await quiet(ref, probe)
    assert incarnations == [0, 1]
    assert clock.advance(1) == 0  # the old timers are gone too


async def test_timers_cancelled_when_actor_stops(
    clock: ManualClock, system: ActorSystem, ref: ActorRef
) -> None:
    await ref.ask(("every", 0.01, "beat"))
    await ref.ask(("once", 0.05, "late"))
    await ref.stop()
    assert clock.pending == 0
    assert clock.advance(1) == 0


async def test_receive_timeout_fires_when_idle_and_resets(
    clock: ManualClock, ref: ActorRef, probe: TestProbe
) -> None:
    await ref.ask(("timeout", 0.15))
    for _ in range(3):  # a message every 0.1 s keeps it from firing
        clock.advance(0.1)
        ref.tell("busy")
        await probe.expect_msg((0, "busy"))
    clock.advance(0.14)
    await probe.expect_no_msg(0.01)
    clock.advance(0.01)
    await probe.expect_msg("timeout")
    clock.advance(0.15)
    await probe.expect_msg("timeout")  # again after each idle period
    await ref.ask(("timeout", None))
    assert clock.advance(1) == 0
    await quiet(ref, probe)


async def test_bad_delays_rejected(ref: ActorRef) -> None:
    with pytest.raises(ValueError, match="delay must be >= 0"):
        await ref.ask(("once", -1, "x"))
    with pytest.raises(ValueError, match="interval must be > 0"):
        await ref.ask(("every", 0, "x"))
    with pytest.raises(TypeError, match="interval must be a number"):
        await ref.ask(("every", "often", "x"))
    with pytest.raises(TypeError):
        await ref.ask(("timeout", "soon"))
    with pytest.raises(ValueError):
        await ref.ask(("timeout", -0.5))
    with pytest.raises(TypeError):
        await ref.ask(("once", 1, "x", ["unhashable key"]))


async def test_system_schedule_once(clock: ManualClock, system: ActorSystem) -> None:
    probe = TestProbe(system)
    system.schedule_once(0.01, probe.ref, "hello")
    clock.advance(0.01)
    await probe.expect_msg("hello")
    timer = system.schedule_once(0.01, probe.ref, "never")
    assert timer.cancel() and not timer.active
    queued = system.schedule_once(0.01, probe.ref, "taken back")
    clock.advance(0.01)
    assert queued.cancel() is True  # it was queued at the probe: taken back
    await probe.expect_no_msg(0.02)


async def test_real_loop_timers_still_work(actor_system: ActorSystem) -> None:
    """Without a ManualClock, timers run on the event loop."""
    probe = TestProbe(actor_system)
    ref = actor_system.spawn(Props(Scheduler, probe.ref, []))
    await ref.ask(("once", 0.01, "tick"))
    await probe.expect_msg((0, "tick"), timeout=5)


class StashesTicksUntilReady(Actor):
    """Stashes its timer's tick until "init"; then unstashes it and starts
    a new timer of the same key (which must not take the unstashed tick)."""

    def __init__(self, probe: ActorRef) -> None:
        super().__init__()
        self.probe = probe
        self.ready = False

    def receive(self, message: Any) -> Any:
        if message == "start":
            return self.context.schedule_once(0.1, "tick", key="t")
        if message == "init":
            self.ready = True
            self.context.unstash_all()
            return self.context.schedule_once(10.0, "tick2", key="t")
        if not self.ready:
            self.context.stash()
            return None
        self.probe.tell(message)
        return None


async def test_a_stashed_tick_is_the_actors_own_after_unstash(
    clock: ManualClock, system: ActorSystem, probe: TestProbe
) -> None:
    ref = system.spawn(Props(StashesTicksUntilReady, probe.ref))
    first: Cancellable = await ref.ask("start")
    assert clock.advance(0.1) == 1  # "tick" is queued before "init"
    await ref.ask("init")
    await probe.expect_msg("tick")  # not taken back by the new timer of its key
    assert first.cancel() is False  # it was received: nothing to cancel
    await ref.ask("sync")
    await probe.expect_msg("sync")


@pytest.mark.parametrize("policy", list(OverflowPolicy))
async def test_ticks_respect_a_bounded_mailbox(
    clock: ManualClock, system: ActorSystem, probe: TestProbe, policy: OverflowPolicy
) -> None:
    """A repeating timer faster than its actor fills a bounded mailbox only up
    to its capacity; the policy drops the rest, and where it would raise, a
    tick is a dead letter (the mailbox grew without limit)."""
    props = Props(Scheduler, probe.ref, []).with_mailbox(BoundedMailbox(2, policy))
    ref = system.spawn(props)
    await ref.ask(("every", 0.1, "beat"))
    gate = asyncio.get_running_loop().create_future()
    ref.tell(("hold", gate, ("sync",)))
    await probe.expect_msg("holding")
    ref.tell("first")  # one of the two places
    assert clock.advance(1.05) == 10
    assert system.dead_letters.count == 9  # 8 ticks, and "first" or a 9th tick
    gate.set_result(None)
    if policy is OverflowPolicy.DROP_OLDEST:
        assert await probe.receive_n(2) == [(0, "beat"), (0, "beat")]
    else:
        assert await probe.receive_n(2) == [(0, "first"), (0, "beat")]
    await quiet(ref, probe)
