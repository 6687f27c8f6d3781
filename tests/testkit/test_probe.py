"""`TestProbe` against Akka TestKit's rules for `within` and its waits: an
`expect_no_msg` in a block whose max has passed fails saying so (a message
already there included), one cut to the block's max does not fail the block
for ending just after it, and a block's bounds are finite."""

from __future__ import annotations

import asyncio

import pytest

from atomr import ActorSystem
from atomr.testkit import TestProbe


async def test_expect_no_msg_in_a_spent_within_block_fails_saying_so(
    actor_system: ActorSystem,
) -> None:
    probe = TestProbe(actor_system)
    with pytest.raises(AssertionError, match="max has passed, leaving no time to check"):
        async with probe.within(0):  # spent as it starts
            await probe.expect_no_msg(5)  # was: returned at once, passing the check unchecked


async def test_expect_no_msg_in_a_spent_within_block_fails_on_a_message_already_there(
    actor_system: ActorSystem,
) -> None:
    probe = TestProbe(actor_system)
    probe.ref.tell("a")
    probe.ref.tell("b")  # the probe actor queues both in one turn
    await probe.expect_msg("a")
    with pytest.raises(AssertionError, match="expected no message, got 'b'"):
        async with probe.within(0):
            await probe.expect_no_msg()  # was: passed, 'b' left unseen in the queue
    await probe.expect_no_msg(0.01)  # 'b' was taken


async def test_a_block_ending_in_an_expect_no_msg_cut_to_its_max_passes(
    actor_system: ActorSystem,
) -> None:
    probe = TestProbe(actor_system)
    async with probe.within(0.05):
        await probe.expect_no_msg(10)  # was: cut to 0.05 s, then the block failed for 0.05x s


async def test_a_block_that_overruns_after_an_uncut_expect_no_msg_still_fails(
    actor_system: ActorSystem,
) -> None:
    probe = TestProbe(actor_system)
    with pytest.raises(AssertionError, match="more than within's max"):
        async with probe.within(0.05):
            await probe.expect_no_msg(0.01)  # ends before the max: no excuse
            await asyncio.sleep(0.1)  # the overrun under test


async def test_a_wait_in_a_spent_within_block_says_the_block_spent_it(
    actor_system: ActorSystem,
) -> None:
    probe = TestProbe(actor_system)
    with pytest.raises(AssertionError, match="waiting for 'x': the enclosing within block's max"):
        async with probe.within(0):
            await probe.expect_msg("x", timeout=5)  # was: "timeout (0 s)", saying no more


@pytest.mark.parametrize(
    "bounds", [{"max": float("inf")}, {"max": float("inf"), "min": float("inf")}]
)
async def test_within_refuses_an_endless_bound(
    actor_system: ActorSystem, bounds: dict[str, float]
) -> None:
    probe = TestProbe(actor_system)
    ran = []
    with pytest.raises(ValueError, match="must be a finite number of seconds"):
        async with probe.within(**bounds):  # was: a block that could never overrun
            ran.append(True)
    assert not ran


@pytest.mark.parametrize(
    ("duration", "error"),
    [(0, ValueError), (-1, ValueError), (float("nan"), ValueError), (True, TypeError)],
)
async def test_a_refused_expect_no_msg_names_its_duration(
    actor_system: ActorSystem, duration: object, error: type[Exception]
) -> None:
    probe = TestProbe(actor_system)
    with pytest.raises(error, match="^duration must be"):  # was: "timeout must be ..."
        await probe.expect_no_msg(duration)  # type: ignore[arg-type]


async def test_an_async_predicate_is_refused_not_taken_as_true(actor_system: ActorSystem) -> None:
    probe = TestProbe(actor_system)

    async def is_three(message: object) -> bool:
        return message == 3

    probe.ref.tell(1)
    with pytest.raises(TypeError, match="is_three is an async function"):
        await probe.fish_for_message(is_three)  # was: returned 1, its coroutine being true
    with pytest.raises(TypeError, match="is_three is an async function"):
        probe.ignore_msg(is_three)  # was: every message dropped
    with pytest.raises(TypeError, match="returned an awaitable, which is always true"):
        await probe.fish_for_message(lambda m: is_three(m))  # type: ignore[arg-type, return-value]
    probe.ignore_msg(lambda m: is_three(m))  # type: ignore[arg-type, return-value]
    probe.ref.tell(5)
    with pytest.raises(AssertionError, match="predicate raised TypeError.*awaitable.* on 5"):
        await probe.expect_msg(5)  # was: 5 dropped, a timeout
