"""``forward`` to several actors: one ask shared by all of them, answered by
the first to answer, failed only once every one that took it has dropped it
(stopped before answering, or dropped it from a full mailbox). Skipping those
refusing it as it is forwarded: test_context.py; broadcast pools: test_router.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from atomr import (
    Actor,
    ActorRef,
    ActorStoppedError,
    ActorSystem,
    BoundedMailbox,
    MailboxFullError,
    OverflowPolicy,
    PoisonPill,
    Props,
)
from atomr.testkit import TestProbe, expect_log


class Relay(Actor):
    """Forwards each message to ``targets``, then tells ``probe`` "forwarded"."""

    def __init__(self, targets: list[ActorRef], probe: ActorRef) -> None:
        super().__init__()
        self.targets = targets
        self.probe = probe

    def receive(self, message: Any) -> Any:
        self.context.forward(*self.targets)
        self.probe.tell(("forwarded", message))


class Gated(Actor):
    """Tells ``probe`` what it handles, then answers it once ``gate`` is set;
    with ``defers``, keeps a deferred reply instead, never answered."""

    def __init__(self, gate: asyncio.Event, probe: ActorRef, defers: bool = False) -> None:
        super().__init__()
        self.gate = gate
        self.probe = probe
        self.defers = defers
        self.kept: list[Any] = []

    async def receive(self, message: Any) -> Any:
        self.probe.tell(("handling", message))
        if self.defers:
            self.kept.append(self.context.defer())
            return None
        await self.gate.wait()
        return message


def _gated(system: ActorSystem, **options: Any) -> tuple[ActorRef, asyncio.Event]:
    """An actor answering once the event is set (a probe nobody reads hears it)."""
    gate = asyncio.Event()
    return system.spawn(Props(Gated, gate, TestProbe(system).ref, **options)), gate


async def _takes_then_drops(system: ActorSystem, how: str) -> tuple[ActorRef, Any]:
    """An actor that will take the ask "x" and drop it when told, `how`:
    "queued" (it stops before handling it), "handling" (its handler is
    stopped), "deferred" (stopped with its deferred reply out), "mailbox"
    (its full ``DROP_OLDEST`` mailbox drops it). Returns it and the
    coroutine function that drops the ask (once forwarded)."""
    probe = TestProbe(system)
    gate = asyncio.Event()
    props = Props(Gated, gate, probe.ref, defers=how == "deferred")
    if how == "mailbox":
        props = props.with_mailbox(BoundedMailbox(1, OverflowPolicy.DROP_OLDEST))
    ref = system.spawn(props)
    if how in ("queued", "mailbox"):
        ref.tell("wait")  # busy while the ask comes in
        await probe.expect_msg(("handling", "wait"))
    if how == "queued":
        ref.tell(PoisonPill())  # stops before the ask, queued behind it

    async def drop() -> None:
        if how == "mailbox":
            ref.tell("newer")  # full: the ask, the oldest, is dropped
            return
        probe.watch(ref)
        if how == "queued":
            gate.set()
        else:
            await probe.expect_msg(("handling", "x"))
            await ref.stop()
        await probe.expect_terminated(ref)

    return ref, drop


async def _ask_through(system: ActorSystem, targets: list[ActorRef]) -> asyncio.Future[Any]:
    """Ask "x" of a `Relay` to `targets`; returns once it has forwarded it."""
    probe = TestProbe(system)
    relay = system.spawn(Props(Relay, targets, probe.ref))
    asked = asyncio.ensure_future(relay.ask("x", timeout=5))
    await probe.expect_msg(("forwarded", "x"))
    return asked


@pytest.mark.parametrize("how", ["queued", "handling", "deferred", "mailbox"])
async def test_one_that_takes_the_ask_and_drops_it_leaves_it_to_the_others(
    actor_system: ActorSystem, how: str
) -> None:
    # was: ActorStoppedError (MailboxFullError) at the drop, though the other
    # actor answered it later
    dropping, drop = await _takes_then_drops(actor_system, how)
    answering, gate = _gated(actor_system)
    asked = await _ask_through(actor_system, [dropping, answering])
    await drop()
    assert not asked.done()
    gate.set()
    assert await asked == "x"


@pytest.mark.parametrize("last", ["stopped", "mailbox"])
async def test_the_ask_fails_with_the_last_drop_once_every_one_dropped_it(
    actor_system: ActorSystem, last: str
) -> None:
    # was: it failed at the first drop, with that one's error
    stopping, stop = await _takes_then_drops(actor_system, "queued")
    full, drop_from_mailbox = await _takes_then_drops(actor_system, "mailbox")
    asked = await _ask_through(actor_system, [stopping, full])
    first, second = (stop, drop_from_mailbox) if last == "mailbox" else (drop_from_mailbox, stop)
    await first()
    assert not asked.done()
    await second()
    with pytest.raises(MailboxFullError if last == "mailbox" else ActorStoppedError):
        await asked


async def test_a_shared_ask_forwarded_on_to_several_counts_each_of_them(
    actor_system: ActorSystem,
) -> None:
    # a relay among the first ones forwards it on to two that both drop it:
    # the other first one still answers
    dropping = [await _takes_then_drops(actor_system, "mailbox") for _ in range(2)]
    probe = TestProbe(actor_system)
    inner = actor_system.spawn(Props(Relay, [ref for ref, _ in dropping], probe.ref))
    answering, gate = _gated(actor_system)
    asked = await _ask_through(actor_system, [inner, answering])
    await probe.expect_msg(("forwarded", "x"))
    for _, drop in dropping:
        await drop()
    assert not asked.done()
    gate.set()
    assert await asked == "x"


class Fatal(BaseException):
    """Not an ``Exception``: escaping a handler, it stops the actor."""


class Dies(Actor):
    def receive(self, message: Any) -> Any:
        raise Fatal(message)


async def test_one_that_dies_holding_the_ask_drops_it_once(actor_system: ActorSystem) -> None:
    # it was dropped twice (as the BaseException escaped, then as the actor
    # ended): the next one to drop it failed it though a third still held it
    probe = TestProbe(actor_system)
    dying = probe.watch(actor_system.spawn(Props(Dies)))
    dropping, drop = await _takes_then_drops(actor_system, "handling")
    answering, gate = _gated(actor_system)
    async with expect_log("Fatal", level="CRITICAL"):
        asked = await _ask_through(actor_system, [dying, dropping, answering])
        await probe.expect_terminated(dying)
    await drop()
    assert not asked.done()
    gate.set()
    assert await asked == "x"


class Raises(Actor):
    def receive(self, message: Any) -> Any:
        raise ValueError(f"answered {message}")


async def test_the_first_answer_wins_though_another_holds_the_ask(
    actor_system: ActorSystem,
) -> None:
    waiting, _ = _gated(actor_system)  # never answers
    asked = await _ask_through(actor_system, [waiting, actor_system.spawn(Props(Raises))])
    with pytest.raises(ValueError, match="answered x"):
        await asked
