"""ActorRef: tell, ask, timeouts, replies, ordering, volume."""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

import pytest

from atomr import (
    Actor,
    ActorStoppedError,
    ActorSystem,
    AskTimeoutError,
    Failure,
    Props,
)
from atomr.testkit import TestProbe

from .actors import Echo


class Counter(Actor):
    def __init__(self, n: int, done: asyncio.Future[list[int]]) -> None:
        super().__init__()
        self.n = n
        self.seen: list[int] = []
        self.done = done

    def receive(self, message: Any) -> None:
        self.seen.append(message)
        if len(self.seen) == self.n:
            self.done.set_result(self.seen)


class Silent(Actor):
    def receive(self, message: Any) -> None:
        self.context.defer()  # never answered


class Slow(Actor):
    async def receive(self, message: Any) -> Any:
        await asyncio.sleep(message)
        return message


async def test_ask_returns_the_return_value(actor_system: ActorSystem) -> None:
    ref = actor_system.spawn(Props(Echo))
    assert await ref.ask("hi", timeout=1.0) == "hi"
    assert await ref.ask(42) == 42


async def test_async_receive_is_awaited(actor_system: ActorSystem) -> None:
    ref = actor_system.spawn(Props(Slow))
    assert await ref.ask(0.01, timeout=1.0) == 0.01


async def test_tell_order_per_sender_receiver_pair(actor_system: ActorSystem) -> None:
    probe = TestProbe(actor_system)
    middle = actor_system.spawn(Props(_Relay, probe.ref))
    for i in range(200):
        middle.tell(("a", i))
        middle.tell(("b", i))
    received = await probe.receive_n(400)
    for sender in ("a", "b"):
        assert [i for s, i in received if s == sender] == list(range(200))


class _Relay(Actor):
    def __init__(self, target: Any) -> None:
        super().__init__()
        self.target = target

    async def receive(self, message: Any) -> None:
        if message[1] % 7 == 0:
            await asyncio.sleep(0)
        self.target.tell(message)


async def test_a_million_tells_each_received_once(actor_system: ActorSystem) -> None:
    n = 1_000_000
    done: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
    ref = actor_system.spawn(Props(Counter, n, done))
    tell = ref.tell
    for i in range(n):
        tell(i)
    seen = await asyncio.wait_for(done, 30)
    assert seen == list(range(n))


async def test_ten_thousand_concurrent_asks(actor_system: ActorSystem) -> None:
    ref = actor_system.spawn(Props(Echo))
    replies = await asyncio.gather(*(ref.ask(i, timeout=30) for i in range(10_000)))
    assert replies == list(range(10_000))


async def test_ask_timeout_raises(actor_system: ActorSystem) -> None:
    ref = actor_system.spawn(Props(Silent))
    with pytest.raises(AskTimeoutError, match="timed out after 0.05"):
        await ref.ask("x", timeout=0.05)
    assert isinstance(AskTimeoutError(), TimeoutError)


class HoldsFirst(Actor):
    """Defers its answer to "hold" (until "release"); echoes everything else."""

    def __init__(self) -> None:
        super().__init__()
        self.held: Any = None

    def receive(self, message: Any) -> Any:
        if message == "hold":
            self.held = self.context.defer()
            return None
        if message == "release":
            self.held.set_result("held")
        return message


async def test_asks_sharing_a_timeout_each_expire_at_their_own_deadline(
    actor_system: ActorSystem,
) -> None:
    # Asks with one timeout share one timer: answered ones must not move the
    # deadline of those still pending, and each times out on time.
    loop = asyncio.get_running_loop()
    ref = actor_system.spawn(Props(HoldsFirst))
    held = asyncio.ensure_future(ref.ask("hold", timeout=0.3))
    for i in range(50):
        assert await ref.ask(i, timeout=0.3) == i
    # the late ask starts 50 ms after the answered ones, so its deadline differs from theirs
    await asyncio.sleep(0.05)
    started = loop.time()
    late = asyncio.ensure_future(ref.ask("hold", timeout=0.3))
    with pytest.raises(AskTimeoutError, match="timed out after 0.3"):
        await held
    with pytest.raises(AskTimeoutError, match="timed out after 0.3"):
        await late
    # the second one's own deadline, not the first's (which is earlier); the upper
    # bound only catches a deadline that never fires
    assert 0.29 <= loop.time() - started < 2.0


async def test_answered_asks_are_not_kept_behind_a_pending_one(
    actor_system: ActorSystem,
) -> None:
    # A deferred ask at the head of the shared deadline queue must not keep
    # the messages of the thousands answered after it alive until it ends.
    class Message:
        pass

    ref = actor_system.spawn(Props(HoldsFirst))
    held = asyncio.ensure_future(ref.ask("hold", timeout=30.0))
    alive = weakref.WeakSet[Message]()
    for _ in range(5000):
        message = Message()
        alive.add(message)
        await ref.ask(message, timeout=30.0)
        del message
    assert len(alive) < 200  # bounded by the compaction threshold, not by 5000
    ref.tell("release")
    assert await held == "held"


async def test_ask_timeouts_of_many_values_all_hold(actor_system: ActorSystem) -> None:
    # More distinct timeouts than shared timers: each still times out.
    ref = actor_system.spawn(Props(Silent))
    timeouts = [0.05 + 0.01 * k for k in range(12)]
    results = await asyncio.gather(
        *(ref.ask(k, timeout=t) for k, t in enumerate(timeouts)), return_exceptions=True
    )
    assert all(isinstance(r, AskTimeoutError) for r in results)


async def test_ask_to_stopped_actor_raises_at_once(actor_system: ActorSystem) -> None:
    ref = actor_system.spawn(Props(Echo))
    await ref.stop()
    assert not ref.is_alive
    with pytest.raises(ActorStoppedError):
        await ref.ask("x", timeout=None)


async def test_pending_asks_fail_when_actor_stops(actor_system: ActorSystem) -> None:
    ref = actor_system.spawn(Props(Silent))
    pending = asyncio.ensure_future(ref.ask("x", timeout=None))
    await asyncio.sleep(0)  # one turn: the ask is queued
    ref.stop()
    with pytest.raises(ActorStoppedError):
        await pending


class Blocks(Actor):
    """Says it started handling, then waits for ever; says if it was cancelled."""

    def __init__(self, started: asyncio.Event, cancelled: asyncio.Event) -> None:
        super().__init__()
        self.started, self.cancelled = started, cancelled

    async def receive(self, message: Any) -> Any:
        self.started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


async def test_stop_cancels_awaiting_handler_and_fails_its_ask(actor_system: ActorSystem) -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()
    ref = actor_system.spawn(Props(Blocks, started, cancelled))
    pending = asyncio.ensure_future(ref.ask("x", timeout=None))
    await asyncio.wait_for(started.wait(), 5)  # the handler is awaiting
    await asyncio.wait_for(ref.stop(), 5)
    assert cancelled.is_set()
    with pytest.raises(ActorStoppedError):
        await pending


async def test_handler_exception_reaches_asker(actor_system: ActorSystem) -> None:
    ref = actor_system.spawn(Props(Echo))
    with pytest.raises(KeyError, match="boom"):
        await ref.ask(KeyError("boom"))
    assert await ref.ask("after") == "after"  # restarted by default


class Validating(Actor):
    def __init__(self) -> None:
        super().__init__()
        self.state = 0

    def receive(self, message: Any) -> Any:
        if message < 0:
            return Failure(ValueError(f"negative: {message}"))
        self.state += message
        return self.state


async def test_failure_answers_without_failing_the_actor(actor_system: ActorSystem) -> None:
    ref = actor_system.spawn(Props(Validating))
    assert await ref.ask(5) == 5
    with pytest.raises(ValueError, match="negative: -1"):
        await ref.ask(-1)
    assert await ref.ask(1) == 6  # state kept: no restart


async def test_bad_ask_timeouts_are_rejected(actor_system: ActorSystem) -> None:
    ref = actor_system.spawn(Props(Echo))
    with pytest.raises(ValueError, match="timeout must be > 0"):
        await ref.ask("x", timeout=-1)
    with pytest.raises(ValueError):
        await ref.ask("x", timeout=0)
    with pytest.raises(TypeError):
        await ref.ask("x", timeout="1")  # type: ignore[arg-type]
    assert await ref.ask("x", timeout=1) == "x"


async def test_int_ask_timeouts_skip_the_full_check_with_the_same_outcome(
    actor_system: ActorSystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An ordinary int is taken as its float with no check_timeout call; every
    # other int (zero, negative, huge, a bool) still gets the full check.
    from atomr.actor import ref as ref_module

    seen: list[object] = []
    full_check = ref_module.check_timeout

    def spy(timeout: object) -> float | None:
        seen.append(timeout)
        return full_check(timeout)

    monkeypatch.setattr(ref_module, "check_timeout", spy)
    ref = actor_system.spawn(Props(Echo))
    assert await ref.ask("x", timeout=60) == "x"
    assert seen == []
    for bad, error in [(0, ValueError), (-1, ValueError), (2**1100, ValueError), (True, TypeError)]:
        with pytest.raises(error):
            await ref.ask("x", timeout=bad)
    assert await ref.ask("x", timeout=2**53) == "x"  # exact in a float, but checked
    assert seen == [0, -1, 2**1100, True, 2**53]


async def test_tell_with_sender(actor_system: ActorSystem) -> None:
    probe = TestProbe(actor_system)
    ref = actor_system.spawn(Props(_ReplyToSender))
    ref.tell("ping", sender=probe.ref)
    await probe.expect_msg(("pong", "ping"))
    assert probe.last_sender == ref


class _ReplyToSender(Actor):
    def receive(self, message: Any) -> None:
        sender = self.context.sender
        assert sender is not None
        sender.tell(("pong", message), sender=self.context.self_ref)


async def test_ref_identity_and_path(actor_system: ActorSystem) -> None:
    ref = actor_system.spawn(Props(Echo), name="echo")
    assert ref.path == "atomr://test/user/echo"
    assert ref.name == "echo"
    assert "echo" in repr(ref)


class AwaitsCancelledTask(Actor):
    """Cancels a task of its own and awaits it without catching CancelledError."""

    async def receive(self, message: Any) -> Any:
        task = asyncio.create_task(asyncio.sleep(3600))
        await asyncio.sleep(0)
        task.cancel()
        await task


async def test_handler_letting_cancelled_error_escape_fails_ask_and_logs(
    actor_system: ActorSystem, caplog: pytest.LogCaptureFixture
) -> None:
    ref = actor_system.spawn(Props(AwaitsCancelledTask))
    with pytest.raises(ActorStoppedError) as answered:
        await ref.ask("go", timeout=5)  # was: no answer until the ask timed out
    assert not ref.is_alive
    assert any("CancelledError" in r.getMessage() for r in caplog.records)
    with pytest.raises(ActorStoppedError) as later:
        await ref.ask("again")
    for error in (answered.value, later.value):  # were told its event loop had shut down
        assert "cancelled from outside" not in str(error)
        assert "CancelledError escaped its own code" in str(error)


class RaisingRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


async def test_ask_timeout_text_is_bounded_even_for_hostile_messages(
    actor_system: ActorSystem,
) -> None:
    ref = actor_system.spawn(Props(Silent))
    with pytest.raises(AskTimeoutError, match="RaisingRepr"):  # was: never ended
        await asyncio.wait_for(ref.ask(RaisingRepr(), timeout=0.01), 5)
    with pytest.raises(AskTimeoutError) as caught:
        await ref.ask(list(range(1_000_000)), timeout=0.01)
    assert len(str(caught.value)) < 400
    await ref.stop()
    with pytest.raises(ActorStoppedError) as stopped:
        await ref.ask(list(range(1_000_000)))
    assert len(str(stopped.value)) < 400


class AwaitsItsOwnStop(Actor):
    """Awaits its own stop in a handler, or (as a child) its parent's in
    ``post_stop``: both waits would wait for the caller itself."""

    def __init__(self, log: list[str], child: bool = False) -> None:
        super().__init__()
        self.log = log
        self.child = child
        if not child:
            self.context.spawn(Props(AwaitsItsOwnStop, log, True), name="kid")

    async def receive(self, message: Any) -> Any:
        await self.context.self_ref.stop()
        return "stopping"

    async def post_stop(self) -> None:
        if self.child:
            parent = self.context.parent
            assert parent is not None
            await parent.stop()
        self.log.append("kid" if self.child else "parent")


async def test_awaiting_ones_own_or_an_ancestors_stop_returns_at_once(
    actor_system: ActorSystem,
) -> None:
    log: list[str] = []
    ref = actor_system.spawn(Props(AwaitsItsOwnStop, log))
    assert await ref.ask("stop yourself", timeout=5) == "stopping"
    await asyncio.wait_for(ref.stop(), 5)
    assert log == ["kid", "parent"] and not ref.is_alive
