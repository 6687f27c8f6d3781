"""The Actor class and its handler: construction only by spawn, what escapes a
handler, and the runtime's logging."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import pytest

from atomr import Actor, ActorStoppedError, ActorSystem, Props
from atomr.testkit import TestProbe, expect_log

from .actors import Echo


class Inner(Actor):
    def receive(self, message: Any) -> Any:
        return message


class BuildsInnerDirectly(Actor):
    """Instantiates another actor class in its constructor (not via spawn)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = Inner()

    def receive(self, message: Any) -> Any:
        return self.inner.context.self_ref  # must raise: Inner has no context


class InnerUsesContext(Actor):
    def __init__(self) -> None:
        super().__init__()
        self.me = self.context.self_ref


class BuildsContextUser(Actor):
    def __init__(self) -> None:
        super().__init__()
        self.inner = InnerUsesContext()


async def test_actor_built_inside_a_constructor_gets_no_context(
    actor_system: ActorSystem,
) -> None:
    outer = actor_system.spawn(Props(BuildsInnerDirectly))
    with pytest.raises(RuntimeError, match="not created by spawn"):
        await outer.ask("whose context?")
    with pytest.raises(RuntimeError, match="not created by spawn"):
        actor_system.spawn(Props(BuildsContextUser))
    with pytest.raises(RuntimeError, match="not created by spawn"):
        Inner().context  # noqa: B018 - at top level, as before


async def test_a_factory_handing_one_instance_to_two_actors_is_refused(
    actor_system: ActorSystem,
) -> None:
    shared = Inner()
    one = actor_system.spawn(Props(lambda: shared), name="one")
    with pytest.raises(TypeError, match="belongs to atomr://test/user/one"):
        actor_system.spawn(Props(lambda: shared), name="two")
    assert await one.ask("still mine") == "still mine"
    assert [str(r.path) for r in actor_system.actors] == ["atomr://test/user/one"]


class Fatal(BaseException):
    """Not an Exception: supervision does not handle it."""


async def test_base_exception_in_handler_is_logged_and_stops_the_actor(
    actor_system: ActorSystem,
) -> None:
    probe = TestProbe(actor_system)
    ref = probe.watch(actor_system.spawn(Props(Echo), name="doomed"))
    async with expect_log(r"doomed \(Echo\) stopped: Fatal", level="CRITICAL", logger="atomr"):
        with pytest.raises(ActorStoppedError, match="Fatal escaped"):
            await ref.ask(Fatal("boom"), timeout=2)
    await probe.expect_terminated(ref)


def test_atomr_logger_has_a_null_handler() -> None:
    """A library user who never configured logging sees no output from atomr."""
    code = (
        "import logging, atomr\n"
        "assert any(isinstance(h, logging.NullHandler) "
        "for h in logging.getLogger('atomr').handlers)\n"
        "logging.getLogger('atomr.actor').warning('must not be printed')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


class _Fatal(BaseException):
    """Not an Exception: outside supervision."""


class FatalPostStop(Actor):
    def receive(self, message: Any) -> Any:
        return message

    def post_stop(self) -> None:
        raise _Fatal("boom in post_stop")


async def test_a_post_stop_raising_a_base_exception_still_ends_the_actor(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with ActorSystem("post-stop") as system:
        ref = system.spawn(Props(FatalPostStop))
        probe = TestProbe(system)
        probe.watch(ref)
        await asyncio.wait_for(ref.stop(), 10)  # was: never done
        await probe.expect_terminated(ref)
        assert ref not in system.actors
    assert any("boom in post_stop" in r.getMessage() for r in caplog.records)


class OwnReceive(Actor):
    """One instance may carry a receive of its own, async where the class's is not."""

    def __init__(self, use_async: bool) -> None:
        super().__init__()
        if use_async:
            self.receive = self.receive_async  # type: ignore[method-assign]

    async def receive_async(self, message: Any) -> Any:
        await asyncio.sleep(0)
        return ("async", message)

    def receive(self, message: Any) -> Any:
        return ("plain", message)


async def test_an_instance_with_its_own_receive_does_not_change_its_class(
    actor_system: ActorSystem,
) -> None:
    own = actor_system.spawn(Props(OwnReceive, True))
    assert await own.ask(1, timeout=5) == ("async", 1)
    plain = actor_system.spawn(Props(OwnReceive, False))
    assert await plain.ask(2, timeout=5) == ("plain", 2)
    assert await own.ask(3, timeout=5) == ("async", 3)


class ReturnsCoroutine(Actor):
    """A plain receive handing back an async helper's coroutine (no `await`)."""

    async def doubled(self, message: int) -> int:
        await asyncio.sleep(0)
        if message < 0:
            raise ValueError("negative")
        return message * 2

    def receive(self, message: Any) -> Any:
        return self.doubled(message)


async def test_a_plain_receive_returning_a_coroutine_has_it_awaited(
    actor_system: ActorSystem,
) -> None:
    ref = actor_system.spawn(Props(ReturnsCoroutine))
    assert await ref.ask(3, timeout=5) == 6
    with pytest.raises(ValueError, match="negative"):
        await ref.ask(-1, timeout=5)  # its failure is the handler's
    assert await ref.ask(4, timeout=5) == 8  # restarted, as after any handler failure
