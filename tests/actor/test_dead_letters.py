"""Dead letters: recorded, observable, never silently dropped."""

from __future__ import annotations

import numpy as np
import pytest

from atomr import ActorSystem, DeadLetter, PoisonPill, Props
from atomr.actor.dead_letters import DeadLetters
from atomr.testkit import TestProbe

from .actors import Echo


async def test_tell_to_stopped_actor_is_a_dead_letter(actor_system: ActorSystem) -> None:
    probe = TestProbe(actor_system)
    unsubscribe = actor_system.dead_letters.subscribe(probe.ref.tell)
    ref = actor_system.spawn(Props(Echo), name="gone")
    await ref.stop()
    ref.tell("hello", sender=probe.ref)
    letter = await probe.expect_msg_type(DeadLetter)
    assert (letter.message, letter.sender, letter.recipient, letter.reason) == (
        "hello",
        probe.ref,
        ref,
        "stopped",
    )
    unsubscribe()
    ref.tell("again")
    await probe.expect_no_msg(0.02)
    assert actor_system.dead_letters.count == 2
    assert actor_system.dead_letters.recent[-1].message == "again"


async def test_messages_after_poison_pill_become_dead_letters(actor_system: ActorSystem) -> None:
    probe = TestProbe(actor_system)
    ref = probe.watch(actor_system.spawn(Props(Echo)))
    for m in ("a", PoisonPill(), "b", "c"):
        ref.tell(m)
    await probe.expect_terminated(ref)
    assert [d.message for d in actor_system.dead_letters.recent] == ["b", "c"]


async def test_stop_overtakes_queued_messages(actor_system: ActorSystem) -> None:
    ref = actor_system.spawn(Props(Echo))
    for m in ("x", "y"):
        ref.tell(m)
    await ref.stop()
    assert [d.message for d in actor_system.dead_letters.recent] == ["x", "y"]


async def test_failing_subscriber_does_not_break_publishing() -> None:
    letters = DeadLetters(keep=2)
    seen: list[object] = []

    def bad(_: DeadLetter) -> None:
        raise RuntimeError("subscriber bug")

    letters.subscribe(bad)
    letters.subscribe(seen.append)
    for i in range(3):
        letters.publish(DeadLetter(i, None, None))  # type: ignore[arg-type]
    assert len(seen) == 3 and letters.count == 3
    assert [d.message for d in letters.recent] == [1, 2]
    with pytest.raises(TypeError):
        letters.subscribe("not callable")  # type: ignore[arg-type]


async def test_a_stopped_subscriber_cannot_loop(actor_system: ActorSystem) -> None:
    probe = TestProbe(actor_system)
    await probe.ref.stop()
    actor_system.dead_letters.subscribe(probe.ref.tell)  # as a test might leave it
    ref = actor_system.spawn(Props(Echo))
    await ref.stop()
    ref.tell("lost")
    # the letter, and the one the subscriber's tell to the stopped probe made
    assert actor_system.dead_letters.count == 2  # was: 330, nested 329 deep
    assert [d.message for d in actor_system.dead_letters.recent][-1].message == "lost"


def test_keep_is_a_count() -> None:
    # a bool was taken, a float or a str refused with deque's or `<`'s words
    assert DeadLetters(keep=np.int64(3)).recent.maxlen == 3
    for keep in (True, 1.5, "3"):
        with pytest.raises(TypeError, match="keep must be an int"):
            DeadLetters(keep=keep)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="keep must be >= 0"):
        DeadLetters(keep=-1)
