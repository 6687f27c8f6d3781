"""`actor_failed`: how an asker tells an exception that failed the actor
(escaped `receive`, so its supervisor decided) from one the actor answered
(`Failure`), whatever the exception's type."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from atomr import Actor, ActorRef, ActorSystem, Failure, Props
from atomr.actor import actor_failed


class Answering(Actor):
    """Raises an exception sent as `("raise", e)`, answers `("answer", e)`
    with `Failure(e)`, and asks `("forward", ref, m)` of `ref`, answering
    with what that ask raised."""

    async def receive(self, message: Any) -> Any:
        verb, *args = message
        if verb == "raise":
            raise args[0]
        if verb == "answer":
            return Failure(args[0])
        ref, inner = args
        try:
            return await ref.ask(inner, timeout=5)
        except ValueError as exc:
            return Failure(exc)


async def test_an_error_escaping_receive_is_marked_and_an_answered_one_is_not(
    actor_system: ActorSystem,
) -> None:
    ref = actor_system.spawn(Props(Answering))
    with pytest.raises(ValueError) as escaped:
        await ref.ask(("raise", ValueError("bad")), timeout=5)
    assert actor_failed(escaped.value)
    with pytest.raises(ValueError) as answered:
        await ref.ask(("answer", ValueError("bad")), timeout=5)
    assert not actor_failed(answered.value)


async def test_an_actor_answering_an_error_it_was_given_clears_the_mark(
    actor_system: ActorSystem,
) -> None:
    failing: ActorRef = actor_system.spawn(Props(Answering))
    relay = actor_system.spawn(Props(Answering))
    with pytest.raises(ValueError) as relayed:  # the relay answered it: the relay is intact
        await relay.ask(("forward", failing, ("raise", ValueError("bad"))), timeout=5)
    assert not actor_failed(relayed.value)


class Deferring(Actor):
    """Defers the answer to `"later"` (never given); raises an exception told
    as `("raise", e)`, or from a task for `("task", e)`."""

    async def receive(self, message: Any) -> Any:
        if message == "later":
            self.context.defer()
            return None
        if message == "sync":
            return "synced"
        verb, error = message
        if verb == "raise":
            raise error

        async def fail() -> None:
            raise error

        self.context.create_task(fail())
        return None


@pytest.mark.parametrize("how", ["raise", "task"])
async def test_a_deferred_reply_failed_by_a_restart_is_marked(
    actor_system: ActorSystem, how: str
) -> None:
    """The restart that discards the instance holding the reply fails the
    ask with the error that failed the actor: the actor failed, whether a
    told message's handler or one of its tasks raised."""
    ref = actor_system.spawn(Props(Deferring))
    pending = asyncio.ensure_future(ref.ask("later", timeout=5))
    assert await ref.ask("sync", timeout=5) == "synced"  # the reply is deferred now
    ref.tell((how, ValueError("bad")))
    with pytest.raises(ValueError) as failed:
        await pending
    assert actor_failed(failed.value)


class DeferredRelay(Actor):
    """Asks `("forward", ref, m)` of `ref` from a task, answering its deferred
    reply with what that ask raised: by `set_exception`, or by
    `set_result(Failure(...))` for `("forward-failure", ref, m)`."""

    async def receive(self, message: Any) -> Any:
        verb, ref, inner = message
        reply = self.context.defer()

        async def relay() -> None:
            try:
                reply.set_result(await ref.ask(inner, timeout=5))
            except ValueError as exc:
                if verb == "forward":
                    reply.set_exception(exc)
                else:
                    reply.set_result(Failure(exc))

        self.context.create_task(relay())
        return None


@pytest.mark.parametrize("verb", ["forward", "forward-failure"])
async def test_an_actor_answering_a_deferred_reply_with_an_error_clears_the_mark(
    actor_system: ActorSystem, verb: str
) -> None:
    failing: ActorRef = actor_system.spawn(Props(Answering))
    relay = actor_system.spawn(Props(DeferredRelay))
    with pytest.raises(ValueError) as relayed:  # the relay answered it: the relay is intact
        await relay.ask((verb, failing, ("raise", ValueError("bad"))), timeout=5)
    assert not actor_failed(relayed.value)
