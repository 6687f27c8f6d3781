"""`ask_all_settled` returns every worker's outcome, never raising one:
with one worker as with several (its single-ask shortcut)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from atomr.actor import Actor, ActorSystem, Props
from atomr.train.comm._fanout import ask_all_settled


class _Held(Actor):
    """Tells `arrived` and never answers."""

    def __init__(self, arrived: threading.Semaphore) -> None:
        super().__init__()
        self.arrived = arrived

    async def receive(self, message: Any) -> Any:
        self.arrived.release()
        await asyncio.Event().wait()


def _serve(holder: dict[str, Any], ready: threading.Event, arrived: threading.Semaphore) -> None:
    """An actor system on this thread's own loop, until `holder["stop"]` is set;
    its actors are left running, so the loop's end cancels their replies."""

    async def main() -> None:
        system = ActorSystem("other-loop")
        holder["refs"] = [system.spawn(Props(_Held, arrived)) for _ in range(2)]
        holder["loop"] = asyncio.get_running_loop()
        holder["stop"] = asyncio.Event()
        ready.set()
        await holder["stop"].wait()

    asyncio.run(main())


async def test_a_reply_cancelled_by_its_actors_loop_is_returned_for_one_worker_too() -> None:
    """With one worker, a reply cancelled by the end of its actor's loop
    escaped as CancelledError (the caller then looked cancelled itself);
    with two, it was returned, as the docstring promises."""
    holder: dict[str, Any] = {}
    ready, arrived = threading.Event(), threading.Semaphore(0)
    thread = threading.Thread(target=_serve, args=(holder, ready, arrived), daemon=True)
    thread.start()
    assert await asyncio.to_thread(ready.wait, 10)
    refs = holder["refs"]
    one = asyncio.create_task(ask_all_settled(refs[:1], "x", 30.0, per_worker=False))
    both = asyncio.create_task(ask_all_settled(refs, "y", 30.0, per_worker=False))
    for _ in range(2):  # refs[0] takes "x" ("y" waits behind it there), refs[1] "y"
        assert await asyncio.to_thread(arrived.acquire, True, 10)
    holder["loop"].call_soon_threadsafe(holder["stop"].set)
    results = await asyncio.wait_for(asyncio.gather(one, both), 10)
    await asyncio.to_thread(thread.join, 10)
    assert [type(r).__name__ for r in results[0]] == ["CancelledError"]
    assert [type(r).__name__ for r in results[1]] == ["CancelledError", "CancelledError"]


async def test_a_caller_cancelled_while_it_waits_is_cancelled(actor_system: ActorSystem) -> None:
    """The caller's own cancel is not taken for a worker's outcome."""
    arrived = threading.Semaphore(0)
    ref = actor_system.spawn(Props(_Held, arrived))
    waiting = asyncio.create_task(ask_all_settled([ref], "x", 30.0, per_worker=False))
    assert await asyncio.to_thread(arrived.acquire, True, 10)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(waiting, 10)
