"""A restart never strands an asker: deferred replies of the discarded
instance fail at once with the error that caused the restart."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from atomr import Actor, ActorSystem, Props, Reply


class Holder(Actor):
    """Defers every ask; "boom" fails the actor."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list[Reply] = []

    def receive(self, message: Any) -> Any:
        """Hold the reply, or fail on "boom", or answer "ping"."""
        if message == "boom":
            raise ConnectionError("injected")
        if message == "ping":
            return "pong"
        self.held.append(self.context.defer())
        return None


async def test_deferred_replies_fail_with_the_restart_error(actor_system: ActorSystem) -> None:
    ref = actor_system.spawn(Props(Holder))
    pending = [asyncio.ensure_future(ref.ask(i, timeout=30.0)) for i in range(3)]
    # a ping asked by a task started after those three is handled after them:
    # once it is answered, the actor holds the three deferred replies
    assert await asyncio.ensure_future(ref.ask("ping", timeout=5.0)) == "pong"
    with pytest.raises(ConnectionError):
        await ref.ask("boom", timeout=5.0)
    done, _ = await asyncio.wait(pending, timeout=5.0)
    assert len(done) == 3  # not left to time out after 30 s
    for fut in pending:
        with pytest.raises(ConnectionError, match="injected"):
            fut.result()
    assert await ref.ask("ping", timeout=5.0) == "pong"  # restarted and serving
