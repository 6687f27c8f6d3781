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
