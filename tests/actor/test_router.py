"""Routers: round-robin and broadcast pools, supervised routees."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from atomr import (
    Actor,
    ActorRef,
    ActorSystem,
    AllForOneStrategy,
    BoundedMailbox,
    BroadcastPool,
    DeadLetter,
    Directive,
    MailboxFullError,
    OneForOneStrategy,
    OverflowPolicy,
    PoisonPill,
    Props,
    RoundRobinPool,
    Terminated,
)
from atomr.testkit import TestProbe


class Worker(Actor):
    def __init__(self, probe: ActorRef) -> None:
        super().__init__()
        self.probe = probe
        self.handled = 0

    def receive(self, message: Any) -> Any:
        if isinstance(message, BaseException):
            raise message
        if message == "ref":
            return self.context.self_ref
        self.handled += 1
        me = self.context.self_ref.name
        self.probe.tell((me, message))
        return (me, self.handled)


async def test_round_robin_spreads_messages(actor_system: ActorSystem) -> None:
    probe = TestProbe(actor_system)
    pool = actor_system.spawn(RoundRobinPool(3, Props(Worker, probe.ref)), name="pool")
    for i in range(6):
        pool.tell(i)
    received = await probe.receive_n(6)
    assert sorted(received, key=lambda r: r[1]) == [(f"routee-{i % 3}", i) for i in range(6)]


async def test_round_robin_ask_answered_by_routee(actor_system: ActorSystem) -> None:
    probe = TestProbe(actor_system)
    pool = actor_system.spawn(RoundRobinPool(2, Props(Worker, probe.ref)))
    replies = await asyncio.gather(*(pool.ask(i) for i in range(4)))
    assert sorted(replies) == [("routee-0", 1), ("routee-0", 2), ("routee-1", 1), ("routee-1", 2)]


async def test_broadcast_reaches_every_routee(actor_system: ActorSystem) -> None:
    probe = TestProbe(actor_system)
    pool = actor_system.spawn(BroadcastPool(3, Props(Worker, probe.ref)))
    pool.tell("all")
    received = await probe.receive_n(3)
    assert sorted(received) == [("routee-0", "all"), ("routee-1", "all"), ("routee-2", "all")]
    reply = await pool.ask("first")
    assert reply[1] == 1 + 1  # the first routee to answer had handled two messages


async def test_pool_supervises_routees(actor_system: ActorSystem) -> None:
    probe = TestProbe(actor_system)
    strategy = OneForOneStrategy(decider=lambda e: Directive.STOP)
    pool = actor_system.spawn(RoundRobinPool(2, Props(Worker, probe.ref), strategy))
    probe.watch(pool)
    first = await pool.ask("ref")
    assert first.name == "routee-0" and (await pool.ask("ref")).name == "routee-1"
    probe.watch(first)
    with pytest.raises(RuntimeError):
        await pool.ask(RuntimeError("routee-0 dies"))
    # every watcher is told in the turn the routee stops: the router's
    # Terminated is queued before the asks below
    await probe.expect_terminated(first)
    for i in range(3):  # only routee-1 is left
        assert (await pool.ask(i))[0] == "routee-1"
    await probe.receive_n(3)
    with pytest.raises(RuntimeError):
        await pool.ask(RuntimeError("routee-1 dies"))
    await probe.expect_terminated(pool)  # no routee left: the router stops


async def test_poison_pill_stops_router_and_routees(actor_system: ActorSystem) -> None:
    probe = TestProbe(actor_system)
    pool = actor_system.spawn(RoundRobinPool(2, Props(Worker, probe.ref)))
    routees = {await pool.ask("ref") for _ in range(2)}
    assert len(routees) == 2
    probe.watch(pool)
    pool.tell(PoisonPill())
    await probe.expect_terminated(pool)
    assert not any(r.is_alive for r in routees)


@pytest.mark.parametrize("pool", [RoundRobinPool, BroadcastPool])
async def test_a_routee_stopped_before_the_router_hears_of_it_is_skipped(
    actor_system: ActorSystem, pool: type[RoundRobinPool]
) -> None:
    # the ask routed to it failed with ActorStoppedError, while a live
    # routee could answer it
    probe = TestProbe(actor_system)
    router = actor_system.spawn(pool(2, Props(Worker, probe.ref)))
    first = await router.ask("ref")
    asks = [asyncio.ensure_future(router.ask("ref", timeout=5)) for _ in range(2)]
    await asyncio.sleep(0)  # one turn: the asks are queued at the router
    first.stop()  # takes no message from now; the router hears of it after the asks
    answers = await asyncio.gather(*asks)
    assert len(set(answers)) == 1 and first not in answers


def test_pool_validation() -> None:
    with pytest.raises(ValueError, match=">= 1"):
        RoundRobinPool(0, Props(Worker, None))
    with pytest.raises(TypeError, match="nr_of_instances must be an int"):
        RoundRobinPool(True, Props(Worker, None))
    # as `atomr._arguments` rules, np.int64(2) is an int (was: TypeError)
    assert BroadcastPool(np.int64(2), Props(Worker, None)).args[0] == 2
    with pytest.raises(TypeError, match="Props"):
        BroadcastPool(2, Worker)  # type: ignore[arg-type]


class SilentFirst(Actor):
    """Routee ``index`` 0 never answers; the others answer with their index."""

    def __init__(self, counter: list[int]) -> None:
        super().__init__()
        self.index = len(counter)
        counter.append(self.index)

    async def receive(self, message: Any) -> Any:
        if self.index == 0:
            await asyncio.sleep(3600)
        return self.index


async def test_broadcast_ask_answered_by_any_routee(actor_system: ActorSystem) -> None:
    pool = actor_system.spawn(BroadcastPool(3, Props(SilentFirst, [])))
    assert await pool.ask("who", timeout=5) in (1, 2)  # was: only routee-0 got the ask


class Held(Actor):
    """Routee ``index`` tells ``probe`` each message (and its own ref), then
    answers with its index once ``gates[index]`` is set; "hold" holds
    routee 0 only."""

    def __init__(self, gates: list[asyncio.Event], counter: list[int], probe: ActorRef) -> None:
        super().__init__()
        self.index = len(counter)
        counter.append(self.index)
        self.gates = gates
        self.probe = probe

    async def receive(self, message: Any) -> Any:
        self.probe.tell((self.index, message, self.context.self_ref))
        if message != "hold" or self.index == 0:
            await self.gates[self.index].wait()
        return self.index


async def test_broadcast_ask_outlives_a_routee_that_stops_before_answering(
    actor_system: ActorSystem,
) -> None:
    # routee-0 took the ask and stopped before handling it (a PoisonPill
    # queued before it): was ActorStoppedError, though routee-1 answered later
    probe = TestProbe(actor_system)
    gates = [asyncio.Event(), asyncio.Event()]
    pool = actor_system.spawn(BroadcastPool(2, Props(Held, gates, [], probe.ref)))
    pool.tell("hold")
    first = (await probe.fish_for_message(lambda m: m[:2] == (0, "hold")))[2]
    first.tell(PoisonPill())  # queued behind "hold"
    asked = asyncio.ensure_future(pool.ask("x", timeout=5))
    # routee-1 has it: then so has routee-0, behind its PoisonPill
    await probe.fish_for_message(lambda m: m[:2] == (1, "x"))
    probe.watch(first)
    gates[0].set()
    await probe.expect_terminated(first)
    assert not asked.done()
    gates[1].set()
    assert await asked == 1


class Failing(Actor):
    def receive(self, message: Any) -> Any:
        raise RuntimeError("sibling fails")


class Announcing(Worker):
    """A Worker that tells its probe when it starts."""

    def pre_start(self) -> None:
        self.probe.tell(("started", self.context.self_ref))


class PoolOwner(Actor):
    """Restarts all its children (the pool included) when one fails."""

    def __init__(self, probe: ActorRef) -> None:
        super().__init__()
        self.context.spawn(RoundRobinPool(2, Props(Announcing, probe)), name="pool")
        self.context.spawn(Props(Failing), name="failing")

    def supervisor_strategy(self) -> AllForOneStrategy:
        return AllForOneStrategy()

    def receive(self, message: Any) -> Any:
        return self.context.child(message)


async def test_restarted_router_does_not_route_terminated_of_old_routees(
    actor_system: ActorSystem,
) -> None:
    probe = TestProbe(actor_system)
    owner = actor_system.spawn(Props(PoolOwner, probe.ref))
    old_routees = {ref for _, ref in await probe.receive_n(2)}
    for routee in old_routees:
        probe.watch(routee)
    pool, failing = await owner.ask("pool"), await owner.ask("failing")
    failing.tell("boom")  # AllForOne: the router restarts, its old routees stop
    events = await probe.receive_n(4)  # two new routees start, the two old ones stop
    assert sorted(type(e).__name__ for e in events) == ["Terminated"] * 2 + ["tuple"] * 2
    assert {e.ref for e in events if isinstance(e, Terminated)} == old_routees
    # the router's own Terminated of the old routees were queued when the probe's were
    pool.tell("after")
    assert (await probe.expect_msg())[1] == "after"  # was: Terminated(old routee)
    await probe.expect_no_msg(0.05)


class Blocked(Actor):
    """Tells ``probe`` it started; every message waits for ``gate``, then is answered."""

    def __init__(self, probe: ActorRef, gate: asyncio.Event) -> None:
        super().__init__()
        self.probe = probe
        self.gate = gate

    def pre_start(self) -> None:
        self.probe.tell("started")

    async def receive(self, message: Any) -> Any:
        await self.gate.wait()
        return message


@pytest.mark.parametrize("policy", [OverflowPolicy.FAIL, OverflowPolicy.BACK_PRESSURE])
async def test_full_routees_do_not_fail_the_router(
    actor_system: ActorSystem, policy: OverflowPolicy
) -> None:
    probe = TestProbe(actor_system)
    gate = asyncio.Event()
    routee = Props(Blocked, probe.ref, gate).with_mailbox(BoundedMailbox(2, policy))
    pool = actor_system.spawn(RoundRobinPool(4, routee))
    assert await probe.receive_n(4) == ["started"] * 4
    asks = [asyncio.ensure_future(pool.ask(i, timeout=10)) for i in range(200)]
    full = [a for a in await _settled(asks, 150) if isinstance(a.exception(), MailboxFullError)]
    assert len(full) >= 150  # each routee holds one in hand and two queued at most
    gate.set()
    await asyncio.wait(asks, timeout=10)
    answers = [a.result() for a in asks if a.exception() is None]
    others = [a.exception() for a in asks if a.exception() is not None]
    assert len(answers) + len(full) == 200, others  # was: 176 ActorStoppedError
    assert len(answers) >= 4
    await probe.expect_no_msg(0.05)  # no routee was restarted
    assert await pool.ask("still routing", timeout=5) == "still routing"


async def _settled(futures: list[asyncio.Future[Any]], count: int) -> list[asyncio.Future[Any]]:
    """Wait (at most 10 s) until ``count`` of ``futures`` are done; return those."""
    pending = set(futures)
    done: list[asyncio.Future[Any]] = []
    while len(done) < count and pending:
        finished, pending = await asyncio.wait(
            pending, timeout=10, return_when=asyncio.FIRST_COMPLETED
        )
        assert finished, f"only {len(done)} of {count} asks ended"
        done += finished
    return done


async def test_a_tell_no_routee_has_room_for_is_a_dead_letter(actor_system: ActorSystem) -> None:
    probe = TestProbe(actor_system)
    gate = asyncio.Event()
    routee = Props(Blocked, probe.ref, gate).with_mailbox(BoundedMailbox(1))
    pool = actor_system.spawn(RoundRobinPool(1, routee))
    await probe.expect_msg("started")
    refused = asyncio.get_running_loop().create_future()

    def on_dead_letter(letter: DeadLetter) -> None:
        if letter.reason == "mailbox full" and not refused.done():
            refused.set_result(letter)

    actor_system.dead_letters.subscribe(on_dead_letter)
    for i in range(3):  # at most one in hand and one queued
        pool.tell(i)
    letter = await asyncio.wait_for(refused, 5)
    assert letter.message in (1, 2) and letter.recipient is pool
    gate.set()
