"""Mailboxes: bounded overflow policies, back-pressure, system-message priority."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import numpy as np
import pytest

from atomr import (
    Actor,
    ActorRef,
    ActorSystem,
    AskTimeoutError,
    BoundedMailbox,
    DeadLetter,
    MailboxFullError,
    OverflowPolicy,
    PoisonPill,
    Props,
)
from atomr.testkit import TestProbe, await_condition


class Gated(Actor):
    """Blocks on the first message until ``gate`` is set, then records everything."""

    def __init__(
        self, gate: asyncio.Event, probe: ActorRef, entered: asyncio.Event | None = None
    ) -> None:
        super().__init__()
        self.gate = gate
        self.probe = probe
        self.entered = entered or asyncio.Event()

    async def receive(self, message: Any) -> Any:
        self.entered.set()
        await self.gate.wait()
        self.probe.tell(message)
        return message


async def gated(system: ActorSystem, capacity: int, policy: OverflowPolicy):
    gate, entered = asyncio.Event(), asyncio.Event()
    probe = TestProbe(system)
    mailbox = BoundedMailbox(capacity, policy)
    ref = system.spawn(Props(Gated, gate, probe.ref, entered).with_mailbox(mailbox))
    ref.tell("first")
    await asyncio.wait_for(entered.wait(), 5)  # "first" is being handled, mailbox empty
    return gate, probe, ref


async def test_drop_newest(actor_system: ActorSystem) -> None:
    letters: list[DeadLetter] = []
    actor_system.dead_letters.subscribe(letters.append)
    gate, probe, ref = await gated(actor_system, 2, OverflowPolicy.DROP_NEWEST)
    for m in ("a", "b", "c"):
        ref.tell(m)
    with pytest.raises(MailboxFullError):
        await ref.ask("d")
    gate.set()
    assert await probe.receive_n(3) == ["first", "a", "b"]
    assert [(d.message, d.reason) for d in letters] == [
        ("c", "mailbox full"),
        ("d", "mailbox full"),
    ]


async def test_drop_oldest(actor_system: ActorSystem) -> None:
    letters: list[DeadLetter] = []
    actor_system.dead_letters.subscribe(letters.append)
    gate, probe, ref = await gated(actor_system, 2, OverflowPolicy.DROP_OLDEST)
    dropped_ask = asyncio.ensure_future(ref.ask("a0"))
    await asyncio.sleep(0)
    for m in ("b", "c", "d"):
        ref.tell(m)
    gate.set()
    assert await probe.receive_n(3) == ["first", "c", "d"]
    with pytest.raises(MailboxFullError):
        await dropped_ask
    assert [d.message for d in letters] == ["a0", "b"]


async def test_fail_raises_in_sender(actor_system: ActorSystem) -> None:
    gate, probe, ref = await gated(actor_system, 1, OverflowPolicy.FAIL)
    ref.tell("a")
    with pytest.raises(MailboxFullError, match=rf"^{re.escape(ref.path)} .*: mailbox full"):
        ref.tell("b")  # the error names whose mailbox it is
    with pytest.raises(MailboxFullError):
        await ref.ask("c")
    gate.set()
    assert await probe.receive_n(2) == ["first", "a"]
    await probe.expect_no_msg(0.02)


async def test_back_pressure_send_waits_for_room(actor_system: ActorSystem) -> None:
    gate, probe, ref = await gated(actor_system, 2, OverflowPolicy.BACK_PRESSURE)
    await ref.send("a")
    await ref.send("b")
    with pytest.raises(MailboxFullError, match="send"):
        ref.tell("x")  # a plain tell cannot wait
    blocked = asyncio.ensure_future(ref.send("c"))
    asked = asyncio.ensure_future(ref.ask("d", timeout=2))
    await asyncio.sleep(0.02)  # time for a wrong wake-up to show: the mailbox is still full
    assert not blocked.done() and not asked.done()
    gate.set()
    await asyncio.wait_for(blocked, 1)
    assert await asked == "d"
    assert await probe.receive_n(5) == ["first", "a", "b", "c", "d"]


async def test_back_pressure_many_senders_lose_nothing(actor_system: ActorSystem) -> None:
    gate = asyncio.Event()
    gate.set()
    probe = TestProbe(actor_system)
    props = Props(Gated, gate, probe.ref).with_mailbox(
        BoundedMailbox(4, OverflowPolicy.BACK_PRESSURE)
    )
    ref = actor_system.spawn(props)

    async def sender(k: int) -> None:
        for i in range(50):
            await ref.send((k, i))

    await asyncio.gather(*(sender(k) for k in range(5)))
    received = await probe.receive_n(250)
    for k in range(5):
        assert [i for s, i in received if s == k] == list(range(50))


async def test_back_pressure_waiter_released_when_actor_stops(actor_system: ActorSystem) -> None:
    gate, probe, ref = await gated(actor_system, 1, OverflowPolicy.BACK_PRESSURE)
    await ref.send("a")
    blocked = asyncio.ensure_future(ref.send("b"))
    await asyncio.sleep(0)  # one turn: the send is waiting for room
    await ref.stop()
    await asyncio.wait_for(blocked, 1)  # returns: "b" became a dead letter
    assert actor_system.dead_letters.recent[-1].message == "b"


class Recorder(Actor):
    def __init__(self, gate: asyncio.Event, log: list[str], tasks: list[asyncio.Task]) -> None:
        super().__init__()
        self.gate = gate
        self.log = log
        self.tasks = tasks

    def pre_start(self) -> None:
        self.log.append("start")

    async def _fail(self) -> None:
        raise RuntimeError("background failure")

    async def receive(self, message: Any) -> Any:
        if message == "block":
            self.tasks.append(self.context.create_task(self._fail()))
            await self.gate.wait()
        self.log.append(message)


async def test_system_messages_overtake_user_messages(actor_system: ActorSystem) -> None:
    gate = asyncio.Event()
    log: list[str] = []
    tasks: list[asyncio.Task] = []
    ref = actor_system.spawn(Props(Recorder, gate, log, tasks))
    ref.tell("block")
    await await_condition(lambda: bool(tasks), message="the handler started its task")
    # the cell's done callback (added first) queues the failure before this wait returns
    await asyncio.wait(tasks)
    for m in ("u1", "u2"):
        ref.tell(m)
    gate.set()
    await ref.ask("sync")
    # the restart (pre_start of the new instance) ran before u1 and u2
    assert log == ["start", "block", "start", "u1", "u2", "sync"]


def test_mailbox_validation() -> None:
    with pytest.raises(ValueError, match="capacity"):
        BoundedMailbox(0)
    with pytest.raises(TypeError):
        BoundedMailbox(2.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="capacity must be an int"):
        BoundedMailbox(True)
    with pytest.raises(ValueError, match="capacity must be <="):
        BoundedMailbox(2**64)
    with pytest.raises(TypeError, match="OverflowPolicy"):
        BoundedMailbox(2, "drop")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Mailbox"):
        Props(Gated).with_mailbox(3)  # type: ignore[arg-type]


class CancelsSender(Actor):
    """Blocks on "block" until ``gate`` is set; cancels ``victim[0]`` on "cancel"."""

    def __init__(
        self, started: asyncio.Event, gate: asyncio.Event, victim: list[asyncio.Task[Any]]
    ) -> None:
        super().__init__()
        self.started = started
        self.gate = gate
        self.victim = victim

    async def receive(self, message: Any) -> Any:
        if message == "block":
            self.started.set()
            await self.gate.wait()
        elif message == "cancel":
            self.victim[0].cancel()  # a sender given room is cancelled before it uses it
        return message


async def test_back_pressure_room_passes_on_when_woken_sender_is_cancelled(
    actor_system: ActorSystem,
) -> None:
    started, gate = asyncio.Event(), asyncio.Event()
    victim: list[asyncio.Task[Any]] = []
    mailbox = BoundedMailbox(1, OverflowPolicy.BACK_PRESSURE)
    ref = actor_system.spawn(Props(CancelsSender, started, gate, victim).with_mailbox(mailbox))
    ref.tell("block")
    await asyncio.wait_for(started.wait(), 3.0)
    ref.tell("cancel")  # the mailbox is full
    victim.append(asyncio.create_task(ref.send("a")))
    waiting = asyncio.create_task(ref.ask("b", timeout=None))
    for _ in range(3):
        await asyncio.sleep(0)  # both senders now wait for room
    gate.set()  # "cancel" is taken out, waking "a", which is then cancelled
    assert await asyncio.wait_for(waiting, 3.0) == "b"
    assert victim[0].cancelled()


async def test_ask_timeout_counts_from_the_call_under_back_pressure(
    actor_system: ActorSystem,
) -> None:
    gate, _, ref = await gated(actor_system, 1, OverflowPolicy.BACK_PRESSURE)
    await ref.send("a")  # full: "first" is being handled, "a" waits
    asked = asyncio.ensure_future(ref.ask("b", timeout=0.2))
    done, _ = await asyncio.wait([asked], timeout=5)  # was: still pending after 5 s
    assert done, "the ask did not end"
    with pytest.raises(AskTimeoutError, match="timed out after 0.2"):
        await asked
    gate.set()


async def test_send_waits_for_room_at_most_its_timeout(actor_system: ActorSystem) -> None:
    gate, _, ref = await gated(actor_system, 1, OverflowPolicy.BACK_PRESSURE)
    await ref.send("a")
    with pytest.raises(MailboxFullError, match="still full after 0.05 s"):
        await asyncio.wait_for(ref.send("b", timeout=0.05), 5)
    gate.set()
    await ref.send("c", timeout=None)  # None: waits as long as it takes


def test_a_numpy_int_is_a_capacity() -> None:
    # as `atomr._arguments` rules, np.int64(8) is an int (was: TypeError)
    mailbox = BoundedMailbox(np.int64(8))
    assert mailbox.capacity == 8 and type(mailbox.copy().capacity) is int


@pytest.mark.parametrize("policy", list(OverflowPolicy), ids=lambda p: p.name)
async def test_a_poison_pill_told_from_a_thread_stops_a_full_actor(
    actor_system: ActorSystem, policy: OverflowPolicy
) -> None:
    """ref.stop() refuses other threads and says to tell PoisonPill(): a full
    mailbox's policy must not turn that pill into a dead letter (FAIL,
    BACK_PRESSURE, DROP_NEWEST did: the actor never stopped) nor drop a queued
    message for it (DROP_OLDEST): like Terminated, it is queued even when full."""
    letters: list[DeadLetter] = []
    actor_system.dead_letters.subscribe(letters.append)
    gate, probe, ref = await gated(actor_system, 1, policy)
    ref.tell("queued")
    await asyncio.get_running_loop().run_in_executor(None, ref.tell, PoisonPill())
    watcher = TestProbe(actor_system)
    watcher.watch(ref)
    gate.set()
    assert await probe.receive_n(2) == ["first", "queued"]
    await watcher.expect_terminated(ref)
    assert letters == []
