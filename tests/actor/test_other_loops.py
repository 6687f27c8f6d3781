"""A system used from another event loop of its own thread (pytest-asyncio
runs a fixture and a test of different loop scopes on two loops of one
thread): its loop cannot run while the other does, so what needs it is
refused at once, saying why, and nothing is sent."""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from atomr import Actor, ActorStoppedError, ActorSystem, BoundedMailbox, OverflowPolicy, Props

from .actors import Echo

IDLE = "runs on another event loop, which is not running now"


class Recorder(Actor):
    """Keeps what it is sent; answers "seen" with it."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[Any] = []

    def receive(self, message: Any) -> Any:
        if message == "seen":
            return list(self.seen)
        self.seen.append(message)
        return message


@pytest.fixture
def home() -> Iterator[asyncio.AbstractEventLoop]:
    """The loop the system is started on; open, but not running in the test."""
    loop = asyncio.new_event_loop()
    try:
        yield loop
    finally:
        loop.close()


def _start(
    home: asyncio.AbstractEventLoop, props: Props, name: str = "home"
) -> tuple[ActorSystem, Any]:
    async def start() -> tuple[ActorSystem, Any]:
        system = ActorSystem(name)
        return system, system.spawn(props)

    return home.run_until_complete(start())


def test_ask_and_send_from_another_loop_of_the_thread_are_refused_unsent(
    home: asyncio.AbstractEventLoop,
) -> None:
    """ask raised asyncio's "got Future attached to a different loop" after
    queueing the message, which the actor then handled once its loop ran
    again (a Step applied that its asker saw fail); send queued it too."""
    system, recorder = _start(home, Props(Recorder))
    bounded = home.run_until_complete(
        _spawned(
            system, Props(Recorder).with_mailbox(BoundedMailbox(4, OverflowPolicy.BACK_PRESSURE))
        )
    )

    async def elsewhere() -> None:
        for ref in (recorder, bounded):
            with pytest.raises(RuntimeError, match=IDLE):
                await ref.ask("asked", timeout=1)
            with pytest.raises(RuntimeError, match=IDLE):
                await ref.ask("asked without a deadline", timeout=None)
            with pytest.raises(RuntimeError, match=IDLE):
                await ref.send("sent")

    asyncio.run(elsewhere())
    for ref in (recorder, bounded):
        assert home.run_until_complete(ref.ask("seen", timeout=5)) == []
    home.run_until_complete(system.terminate(timeout=5))


async def _spawned(system: ActorSystem, props: Props) -> Any:
    return system.spawn(props)


@pytest.mark.parametrize(
    "call",
    [
        lambda system: _spawned(system, Props(Echo)),
        lambda system: system.terminate(timeout=1),
    ],
    ids=["spawn", "terminate"],
)
def test_spawn_and_terminate_from_another_loop_of_the_thread_say_why(
    home: asyncio.AbstractEventLoop, call: Callable[[ActorSystem], Awaitable[Any]]
) -> None:
    """They blamed "another thread" and advised run_coroutine_threadsafe,
    which would wait for ever on a loop that cannot run."""
    system, echo = _start(home, Props(Echo))

    async def elsewhere() -> None:
        with pytest.raises(RuntimeError, match=IDLE) as refused:
            await call(system)
        assert "another thread" not in str(refused.value)

    asyncio.run(elsewhere())
    assert home.run_until_complete(echo.ask("still here", timeout=5)) == "still here"
    assert not system.is_terminated
    home.run_until_complete(system.terminate(timeout=5))


def test_stop_from_another_loop_of_the_thread_is_refused_unchanged(
    home: asyncio.AbstractEventLoop,
) -> None:
    """stop() asked the actor to stop, then awaiting it raised asyncio's
    "attached to a different loop"; with its loop closed, stop() raised
    asyncio's "Event loop is closed"."""
    system, echo = _start(home, Props(Echo))

    async def elsewhere() -> None:
        with pytest.raises(RuntimeError, match=IDLE):
            await echo.stop()

    asyncio.run(elsewhere())
    assert echo.is_alive
    assert home.run_until_complete(echo.ask("still here", timeout=5)) == "still here"
    home.set_exception_handler(lambda loop, context: None)  # its task dies with it
    home.close()

    async def after_close() -> None:
        with pytest.raises(ActorStoppedError, match="event loop is closed"):
            echo.stop()

    asyncio.run(after_close())


def test_a_system_whose_loop_closed_unterminated_says_so(
    home: asyncio.AbstractEventLoop,
) -> None:
    home.set_exception_handler(lambda loop, context: None)  # its task dies with it
    system, _ = _start(home, Props(Echo))
    home.close()

    async def elsewhere() -> None:
        with pytest.raises(RuntimeError, match="closed before it was terminated.*1 top-level"):
            system.spawn(Props(Echo))

    asyncio.run(elsewhere())


class _Parent(Actor):
    """Starts one child; records both actors' post_stop in ``stopped``."""

    def __init__(self, stopped: list[str]) -> None:
        super().__init__()
        self.stopped = stopped

    def pre_start(self) -> None:
        self.context.spawn(Props(_Child, self.stopped), name="child")

    def receive(self, message: Any) -> Any:
        return message

    def post_stop(self) -> None:
        self.stopped.append("parent")


class _Child(_Parent):
    def pre_start(self) -> None:
        pass

    def post_stop(self) -> None:
        self.stopped.append("child")


def test_actors_collected_with_a_loop_closed_unterminated_end_quietly(
    home: asyncio.AbstractEventLoop,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`loop.run_until_complete(main()); loop.close()` without terminating
    the system: when the actors' tasks were garbage collected, each logged
    CRITICAL "GeneratorExit() escaped its handler" with a traceback, and a
    parent, waking its children on the closed loop, left Python's "Exception
    ignored ... RuntimeError: Event loop is closed"."""
    unraisable: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    home.set_exception_handler(lambda loop, context: None)  # asyncio's own "destroyed" note
    stopped: list[str] = []
    system, parent = _start(home, Props(_Parent, stopped), "collected")
    assert home.run_until_complete(parent.ask("ready", timeout=5)) == "ready"
    home.close()
    caplog.set_level(logging.WARNING, logger="atomr")
    del system, parent
    gc.collect()
    assert [u for u in unraisable if "ActorCell._run" in repr(u.object)] == []
    said = [r for r in caplog.records if "atomr://collected/" in r.getMessage()]
    # in the collector's order, which other tests' leftovers change
    assert sorted((r.levelname, r.getMessage().split(" was ")[0]) for r in said) == [
        ("WARNING", "atomr://collected/user/$1 (_Parent)"),
        ("WARNING", "atomr://collected/user/$1/child (_Child)"),
    ]
    assert "closed before its ActorSystem was terminated" in said[0].getMessage()
    assert stopped == []


CANCELLED = "its task was cancelled from outside, without a stop"


def test_an_actor_whose_loop_shut_down_says_why_it_stopped() -> None:
    """A system kept between two asyncio.run calls (a module-level one in
    pytest-asyncio tests): the first loop's end cancelled its actors, and
    the next test's ask said only "ask to stopped actor"."""
    kept: dict[str, Any] = {}

    async def first() -> None:
        kept["echo"] = ActorSystem("kept").spawn(Props(Echo))
        assert await kept["echo"].ask("hello", timeout=5) == "hello"

    async def second() -> None:
        with pytest.raises(ActorStoppedError, match=f"ask to stopped actor .*; {CANCELLED}"):
            await kept["echo"].ask("anyone?", timeout=1)

    asyncio.run(first())
    asyncio.run(second())


async def test_an_actor_cancelled_with_every_task_says_why_it_stopped() -> None:
    """Shutdown code that cancels every task before terminating the system."""
    async with ActorSystem("cancelled") as system:
        echo = system.spawn(Props(Echo))
        assert await echo.ask("hello", timeout=5) == "hello"
        for task in asyncio.all_tasks():
            if task is not asyncio.current_task():
                task.cancel()
        await asyncio.sleep(0)  # the actor's task ends
        with pytest.raises(ActorStoppedError, match=CANCELLED):
            await echo.ask("anyone?", timeout=1)
        stopped = system.spawn(Props(Echo))
        await stopped.stop()
        with pytest.raises(ActorStoppedError) as asked_stopped:
            await stopped.ask("anyone?", timeout=1)
        assert CANCELLED not in str(asked_stopped.value)  # a stop says nothing more
