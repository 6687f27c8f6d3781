"""The testkit: TestProbe and the actor_system fixture."""

from __future__ import annotations

import asyncio

import pytest

from atomr import ActorSystem, Props
from atomr.testkit import TestProbe

from .actors import Echo


async def test_fixture_gives_running_system(actor_system: ActorSystem) -> None:
    assert isinstance(actor_system, ActorSystem) and not actor_system.is_terminated
    assert actor_system.loop is asyncio.get_running_loop()


async def test_expect_msg(actor_system: ActorSystem) -> None:
    probe = TestProbe(actor_system)
    probe.ref.tell("a")
    assert await probe.expect_msg("a") == "a"
    probe.ref.tell("b")
    with pytest.raises(AssertionError, match="expected 'a', got 'b'"):
        await probe.expect_msg("a")
    with pytest.raises(AssertionError, match="timeout"):
        await probe.expect_msg(timeout=0.01)


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
