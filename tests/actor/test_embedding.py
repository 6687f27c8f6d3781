"""A system embedded in a host's event loop (an aiohttp or ASGI service, a
test harness) changes nothing process-wide and leaves nothing behind: no
signal handler, loop policy, exception handler, executor or hook of its own,
no task or idle thread after ``terminate()``, and no error routed to the
loop's exception handler (docs/actors.md, "Embedding in a service")."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest

import atomr
from atomr import Actor, ActorStoppedError, ActorSystem, AskTimeoutError, Props
from atomr.accel import DeviceActor
from atomr.accel.device_actor import OnDevice

from .actors import Echo


class Sleeper(Actor):
    """Answers "slow" after a minute; raises an exception it is sent."""

    async def receive(self, message: Any) -> Any:
        if isinstance(message, Exception):
            raise message
        if message == "slow":
            await asyncio.sleep(60)  # the scenario: a handler still busy when asked
        return message


class Device(DeviceActor):
    """A CPU device actor: its jobs run on a worker thread."""


def _process_state() -> dict[str, Any]:
    """What a library could change behind a host's back."""
    handlers = {}
    for sig in signal.valid_signals():
        try:
            handlers[sig] = signal.getsignal(sig)
        except (OSError, ValueError):  # not a catchable signal here
            continue
    return {
        "signal handlers": handlers,
        "loop policy": asyncio.get_event_loop_policy(),
        "hooks": (sys.excepthook, threading.excepthook, sys.unraisablehook),
        "root log handlers": list(logging.getLogger().handlers),
    }


def _loop_state(loop: asyncio.AbstractEventLoop) -> tuple[Any, ...]:
    return (
        loop.get_exception_handler(),
        loop.get_debug(),
        getattr(loop, "_default_executor", None),  # asyncio's; None until first used
    )


def _atomr_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("atomr")}


async def _exercise(system: ActorSystem) -> None:
    """Failures, timeouts, cancellations and an ask in flight at terminate."""
    sleeper = system.spawn(Props(Sleeper), name="sleeper")
    device = system.spawn(Props(Device, "cpu:0"), name="device")
    assert await device.ask(OnDevice(sum, [1, 2]), timeout=30) == 3
    with pytest.raises(RuntimeError, match="broken"):
        await sleeper.ask(RuntimeError("broken"), timeout=5)  # fails it; restarted
    with pytest.raises(AskTimeoutError):
        await sleeper.ask("slow", timeout=0.01)
    cancelled = asyncio.ensure_future(system.spawn(Props(Sleeper)).ask("slow", timeout=30))
    await asyncio.sleep(0)
    cancelled.cancel()
    in_flight = asyncio.ensure_future(system.spawn(Props(Sleeper)).ask("slow", timeout=30))
    await system.terminate(10)
    with pytest.raises(ActorStoppedError):
        await in_flight


async def test_a_system_at_work_changes_nothing_and_leaves_nothing_behind() -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    previous_handler = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: reported.append(context))
    try:
        process, loop_state = _process_state(), _loop_state(loop)
        tasks, threads = asyncio.all_tasks(), _atomr_threads()
        await _exercise(ActorSystem("embedded"))
        assert asyncio.all_tasks() - tasks - {asyncio.current_task()} == set()
        assert _atomr_threads() <= threads  # the device's idle worker has ended
        assert _process_state() == process
        assert _loop_state(loop) == loop_state
        assert reported == []  # nothing for the host's exception handler
    finally:
        loop.set_exception_handler(previous_handler)


async def test_two_systems_of_one_name_on_one_loop_are_independent() -> None:
    async with ActorSystem("svc") as first, ActorSystem("svc") as second:
        one, two = first.spawn(Props(Echo), name="e"), second.spawn(Props(Echo), name="e")
        assert one != two and one.path == two.path
        await second.terminate()
        assert await one.ask("still here", timeout=5) == "still here"
        with pytest.raises(ActorStoppedError):
            await two.ask("gone", timeout=5)


async def test_a_system_per_request_starts_and_ends_within_its_handler() -> None:
    async def handler(n: int) -> int:
        async with ActorSystem(f"request-{n}") as system:
            answer: int = await system.spawn(Props(Echo)).ask(n, timeout=5)
        assert system.actors == []
        return answer

    assert await asyncio.gather(*(handler(n) for n in range(20))) == list(range(20))


@pytest.mark.parametrize(
    "use",
    [
        lambda system: system.spawn(Props(Echo)),
        lambda system: system.schedule_once(1.0, system.actors[0], "tick"),
    ],
    ids=["spawn", "schedule_once"],
)
async def test_another_thread_s_loop_may_ask_but_not_run_the_system(
    use: Callable[[ActorSystem], Any],
) -> None:
    async with ActorSystem("home") as system:
        echo = system.spawn(Props(Echo))

        async def elsewhere() -> Any:
            with pytest.raises(RuntimeError, match="runs on another event loop"):
                use(system)
            with pytest.raises(RuntimeError, match="runs on another event loop"):
                await system.terminate()
            return await echo.ask("from another loop", timeout=5)

        answer = await asyncio.to_thread(asyncio.run, elsewhere())
        assert answer == "from another loop"
        assert not system.is_terminated and len(system.actors) == 1


def test_atomr_run_uses_uvloop_for_its_own_loop_only() -> None:
    """`atomr.run` picks uvloop by a loop factory: the policy, and so the
    loops a host makes afterwards, stay asyncio's."""
    pytest.importorskip("uvloop")
    process = _process_state()

    async def loop_type() -> str:
        async with ActorSystem("run") as system:
            await system.spawn(Props(Echo)).ask("ok", timeout=5)
        return type(asyncio.get_running_loop()).__module__

    assert atomr.run(loop_type()).startswith("uvloop")
    assert _process_state() == process
    assert asyncio.run(loop_type()).startswith("asyncio")
