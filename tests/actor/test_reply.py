"""`actor_failed`: how an asker tells an exception that failed the actor
(escaped `receive`, so its supervisor decided) from one the actor answered
(`Failure`), whatever the exception's type."""

from __future__ import annotations

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
