"""Context used by code that outlived its actor: a handler that ``terminate``
gave up waiting for. What it hands back to the actor is a dead letter."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import pytest

from atomr import Actor, ActorRef, ActorSystem, Context, DeadLetter, Props
from atomr.testkit import await_condition

Late = Callable[[Context], Any]


class Outlives(Actor):
    """Its handler of "go" swallows the cancellation of its stop until
    ``release`` is set, so ``terminate`` gives up on it; then it calls
    ``late(context)`` and settles ``done`` with what that returns or raises.
    Every message it handles is added to ``seen``."""

    def __init__(
        self, release: asyncio.Event, late: Late, done: asyncio.Future[Any], seen: list[Any]
    ) -> None:
        super().__init__()
        self.release = release
        self.late = late
        self.done = done
        self.seen = seen

    async def receive(self, message: Any) -> Any:
        self.seen.append(message)
        if message != "go":
            return message
        while not self.release.is_set():
            with contextlib.suppress(asyncio.CancelledError):  # the handler that outlives
                await self.release.wait()
        try:
            self.done.set_result(self.late(self.context))
        except Exception as error:
            self.done.set_exception(error)
        return message


async def _outlive(
    late: Late,
) -> tuple[ActorRef, asyncio.Future[Any], list[DeadLetter], list[Any]]:
    """Run ``late`` in a handler of an actor abandoned by ``terminate``.

    Returns its ref, the outcome of ``late``, the dead letters published
    after terminate gave up, and the messages it handled.
    """
    system = ActorSystem("late")
    release, seen = asyncio.Event(), []
    done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    ref = system.spawn(Props(Outlives, release, late, done, seen), name="outlives")
    ref.tell("go")
    await await_condition(lambda: "go" in seen, timeout=5)
    with pytest.raises(TimeoutError, match="abandoned"):
        await system.terminate(timeout=0.1)
    letters: list[DeadLetter] = []
    system.dead_letters.subscribe(letters.append)
    release.set()
    await asyncio.wait((done,), timeout=5)
    assert done.done(), "the late handler did not run"
    return ref, done, letters, seen


def _stash_then_unstash(context: Context) -> int:
    context.stash()
    return context.unstash_all()


@pytest.mark.parametrize("late", [Context.stash, _stash_then_unstash], ids=["stash", "unstash"])
async def test_a_message_stashed_after_the_actor_stopped_is_a_dead_letter(late: Late) -> None:
    ref, done, letters, _ = await _outlive(late)
    await done  # no error: the message is not lost either
    assert [(d.message, d.recipient, d.reason) for d in letters] == [("go", ref, "stopped")]
