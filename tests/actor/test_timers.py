"""Timers: schedule_once, schedule_repeatedly, cancellation, receive timeout."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from atomr import Actor, ActorRef, ActorSystem, Cancellable, Props, ReceiveTimeout
from atomr.testkit import TestProbe


class Scheduler(Actor):
    def __init__(self, probe: ActorRef) -> None:
        super().__init__()
        self.probe = probe
        self.timers: dict[str, Cancellable] = {}

    def receive(self, message: Any) -> Any:
        ctx = self.context
        if isinstance(message, tuple):
            kind, *args = message
            if kind == "once":
                self.timers[args[1]] = ctx.schedule_once(args[0], args[1])
            elif kind == "every":
                self.timers[args[1]] = ctx.schedule_repeatedly(args[0], args[1])
            elif kind == "cancel":
                self.timers[args[0]].cancel()
            elif kind == "timeout":
                ctx.set_receive_timeout(args[0])
            return None
        if isinstance(message, ReceiveTimeout):
            self.probe.tell("timeout")
            return None
        self.probe.tell(message)
        return None


async def make(system: ActorSystem) -> tuple[TestProbe, ActorRef]:
    probe = TestProbe(system)
    return probe, system.spawn(Props(Scheduler, probe.ref))


async def test_schedule_once_fires_once(actor_system: ActorSystem) -> None:
    probe, ref = await make(actor_system)
    await ref.ask(("once", 0.02, "tick"))
    await probe.expect_msg("tick", timeout=1)
    await probe.expect_no_msg(0.05)


async def test_schedule_once_cancelled(actor_system: ActorSystem) -> None:
    probe, ref = await make(actor_system)
    await ref.ask(("once", 0.2, "tick"))
    await ref.ask(("cancel", "tick"))
    await probe.expect_no_msg(0.3)


async def test_schedule_repeatedly_and_cancel(actor_system: ActorSystem) -> None:
    probe, ref = await make(actor_system)
    await ref.ask(("every", 0.01, "beat"))
    assert await probe.receive_n(3, timeout=1) == ["beat"] * 3
    await ref.ask(("cancel", "beat"))
    await asyncio.sleep(0.02)
    while not probe._queue.empty():  # drain beats that were already queued
        probe._queue.get_nowait()
    await probe.expect_no_msg(0.05)


async def test_timers_cancelled_when_actor_stops(actor_system: ActorSystem) -> None:
    probe, ref = await make(actor_system)
    await ref.ask(("every", 0.01, "beat"))
    await ref.ask(("once", 0.05, "late"))
    cell = ref._cell
    await ref.stop()
    assert len(cell.timers) == 0
    await asyncio.sleep(0.07)
    letters = [d.message for d in actor_system.dead_letters.recent]
    assert "late" not in letters


async def test_receive_timeout_fires_when_idle_and_resets(actor_system: ActorSystem) -> None:
    probe, ref = await make(actor_system)
    await ref.ask(("timeout", 0.15))
    for _ in range(4):  # messages every 30 ms keep it from firing
        await asyncio.sleep(0.03)
        ref.tell("busy")
        await probe.expect_msg("busy")
    await probe.expect_msg("timeout", timeout=1)
    await probe.expect_msg("timeout", timeout=1)  # repeats while idle
    await ref.ask(("timeout", None))
    while not probe._queue.empty():
        probe._queue.get_nowait()
    await probe.expect_no_msg(0.2)


async def test_bad_delays_rejected(actor_system: ActorSystem) -> None:
    _, ref = await make(actor_system)
    with pytest.raises(ValueError, match="delay must be >= 0"):
        await ref.ask(("once", -1, "x"))
    with pytest.raises(ValueError, match="interval must be > 0"):
        await ref.ask(("every", 0, "x"))
    with pytest.raises(TypeError):
        await ref.ask(("timeout", "soon"))
    with pytest.raises(ValueError):
        await ref.ask(("timeout", -0.5))


async def test_system_schedule_once(actor_system: ActorSystem) -> None:
    probe = TestProbe(actor_system)
    actor_system.schedule_once(0.01, probe.ref, "hello")
    await probe.expect_msg("hello")
    timer = actor_system.schedule_once(0.01, probe.ref, "never")
    timer.cancel()
    assert not timer.active
    await probe.expect_no_msg(0.03)
