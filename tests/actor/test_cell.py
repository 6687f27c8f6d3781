"""The mailbox loop of ``ActorCell``: what an idle actor still holds."""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any

from atomr import Actor, ActorSystem, Props

from .actors import Echo


class Payload:
    """A large message or answer, which a weak reference can follow."""


class Answers(Actor):
    """Answers every message with a new ``Payload``, kept by the asker only."""

    def receive(self, message: Any) -> Payload:
        return Payload()


class AsyncAnswers(Actor):
    """``Answers`` with an ``async receive``."""

    async def receive(self, message: Any) -> Payload:
        await asyncio.sleep(0)
        return Payload()


class Signals(Actor):
    """Resolves the future it is sent (a plain tell, no ask)."""

    def receive(self, message: Any) -> None:
        if isinstance(message, tuple):
            message[1].set_result(None)


class FailsOnce(Actor):
    """Answers asks with a new ``Payload``; fails on "fail" (restarted, then
    resolves the future it was given)."""

    def __init__(self, restarted: asyncio.Future[None]) -> None:
        super().__init__()
        self.restarted = restarted

    def receive(self, message: Any) -> Payload:
        if message == "fail":
            raise ValueError("fails once")
        return Payload()

    def post_restart(self, error: BaseException) -> None:
        if not self.restarted.done():
            self.restarted.set_result(None)


class StashesFirst(Actor):
    """Stashes the first message, handles the second, unstashes it and answers."""

    def __init__(self) -> None:
        super().__init__()
        self.first = True

    def receive(self, message: Any) -> str:
        if self.first:
            self.first = False
            self.context.stash()
            return "stashed"
        self.context.unstash_all()
        return "done"


async def _freed(alive: weakref.ref[Any]) -> bool:
    # yield once first: the loop's handle that woke this test holds the ask's
    # future (and so its answer) while the test runs on from there
    await asyncio.sleep(0)
    gc.collect()
    return alive() is None


async def test_an_idle_actor_keeps_neither_its_last_message_nor_its_answer(
    actor_system: ActorSystem,
) -> None:
    for actor in (Answers, AsyncAnswers):
        ref = actor_system.spawn(Props(actor))
        message = Payload()
        sent = weakref.ref(message)
        answer = await ref.ask(message)
        answered = weakref.ref(answer)
        del message, answer
        # was: both alive (the loop's locals) until the actor's next message
        assert await _freed(sent), actor
        assert await _freed(answered), actor


async def test_an_idle_actor_keeps_no_echoed_message(actor_system: ActorSystem) -> None:
    ref = actor_system.spawn(Props(Echo))
    payload = Payload()
    alive = weakref.ref(payload)
    assert await ref.ask(payload) is payload
    del payload
    assert await _freed(alive)  # was: alive, held as message, answer and ask's future


async def test_an_idle_actor_keeps_no_told_message(actor_system: ActorSystem) -> None:
    ref = actor_system.spawn(Props(Signals))
    handled = asyncio.get_running_loop().create_future()
    payload = Payload()
    alive = weakref.ref(payload)
    ref.tell((payload, handled))
    await handled  # the actor goes idle before this test resumes
    del payload, handled
    assert await _freed(alive)


async def test_an_actor_idle_after_a_failure_keeps_no_earlier_answer(
    actor_system: ActorSystem,
) -> None:
    restarted = asyncio.get_running_loop().create_future()
    ref = actor_system.spawn(Props(FailsOnce, restarted))
    message = Payload()
    sent = weakref.ref(message)
    answer = await ref.ask(message)
    answered = weakref.ref(answer)
    del message, answer
    ref.tell("fail")
    await restarted  # restarted; idle before this test resumes
    assert await _freed(sent)
    assert await _freed(answered)  # was: alive, the failed handler left no new answer
    assert isinstance(await ref.ask("again"), Payload)


async def test_an_idle_actor_keeps_no_unstashed_message(actor_system: ActorSystem) -> None:
    ref = actor_system.spawn(Props(StashesFirst))
    payload = Payload()
    alive = weakref.ref(payload)
    stashed = asyncio.ensure_future(ref.ask(payload))
    await asyncio.sleep(0)  # the ask is queued first, and stashed
    assert await ref.ask("second") == "done"
    assert await stashed == "done"  # the unstashed message, answered
    del payload, stashed
    assert await _freed(alive)
