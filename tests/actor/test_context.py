"""Context: deferred replies, tasks, children, stash, forward, watch."""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any

import pytest

from atomr import (
    Actor,
    ActorRef,
    ActorStoppedError,
    ActorSystem,
    AskTimeoutError,
    BoundedMailbox,
    Failure,
    MailboxFullError,
    OneForOneStrategy,
    OverflowPolicy,
    Props,
    Terminated,
)
from atomr.testkit import TestProbe, await_condition, expect_log

from .actors import Echo, Forwarder


class Coordinator(Actor):
    """Answers ("get", k) only once ("put", k, v) arrives: deferred replies."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting: dict[str, Any] = {}

    def receive(self, message: Any) -> Any:
        if message[0] == "get":
            self.waiting[message[1]] = self.context.defer()
            return "ignored"
        if message[0] == "put":
            self.waiting.pop(message[1]).set_result(message[2])
            return "stored"
        if message[0] == "fail":
            return self.waiting.pop(message[1]).set_exception(KeyError(message[1]))
        if message[0] == "failure":
            return self.waiting.pop(message[1]).set_result(Failure(ValueError("v")))
        return None


async def test_deferred_reply_lets_actor_keep_taking_messages(actor_system: ActorSystem) -> None:
    ref = actor_system.spawn(Props(Coordinator))
    get_a = asyncio.ensure_future(ref.ask(("get", "a"), timeout=2))
    get_b = asyncio.ensure_future(ref.ask(("get", "b"), timeout=2))
    await asyncio.sleep(0)  # let both asks reach the mailbox
    assert await ref.ask(("put", "b", 2)) == "stored"
    assert await get_b == 2
    assert not get_a.done()
    await ref.ask(("put", "a", 1))
    assert await get_a == 1


async def test_deferred_reply_exceptions(actor_system: ActorSystem) -> None:
    ref = actor_system.spawn(Props(Coordinator))
    pending = asyncio.ensure_future(ref.ask(("get", "k"), timeout=2))
    await asyncio.sleep(0)
    assert await ref.ask(("fail", "k")) is True
    with pytest.raises(KeyError):
        await pending
    pending = asyncio.ensure_future(ref.ask(("get", "k"), timeout=2))
    await asyncio.sleep(0)
    await ref.ask(("failure", "k"))
    with pytest.raises(ValueError):
        await pending


async def test_outstanding_deferred_reply_fails_when_actor_stops(actor_system: ActorSystem) -> None:
    ref = actor_system.spawn(Props(Coordinator))
    pending = asyncio.ensure_future(ref.ask(("get", "x"), timeout=None))
    await ref.ask(("sync",))  # the get was handled before: its reply is deferred
    await ref.stop()
    with pytest.raises(ActorStoppedError):
        await pending


class Tasker(Actor):
    def __init__(self, probe: ActorRef) -> None:
        super().__init__()
        self.probe = probe

    def pre_start(self) -> None:
        self.probe.tell("started")

    async def _work(self, delay: float, fail: bool) -> None:
        try:
            await asyncio.sleep(delay)
            if fail:
                raise RuntimeError("task failed")
            self.probe.tell("task done")
        except asyncio.CancelledError:
            self.probe.tell("task cancelled")
            raise

    def receive(self, message: Any) -> Any:
        delay, fail = message
        reply = self.context.defer()
        task = self.context.create_task(self._work(delay, fail))
        task.add_done_callback(lambda t: reply.set_result("finished"))
        return None


async def test_create_task_runs_and_answers_deferred(actor_system: ActorSystem) -> None:
    probe = TestProbe(actor_system)
    ref = actor_system.spawn(Props(Tasker, probe.ref))
    await probe.expect_msg("started")
    assert await ref.ask((0.0, False), timeout=1) == "finished"
    await probe.expect_msg("task done")


async def test_create_task_cancelled_on_stop(actor_system: ActorSystem) -> None:
    probe = TestProbe(actor_system)
    ref = actor_system.spawn(Props(Tasker, probe.ref))
    await probe.expect_msg("started")
    ref.tell((100.0, False))
    # messages are handled in order: once the second task is done, the first runs
    assert await ref.ask((0.0, False), timeout=1) == "finished"
    await probe.expect_msg("task done")
    await ref.stop()
    await probe.expect_msg("task cancelled")


async def test_create_task_failure_fails_the_actor(actor_system: ActorSystem) -> None:
    probe = TestProbe(actor_system)
    ref = actor_system.spawn(Props(Tasker, probe.ref))
    await probe.expect_msg("started")
    ref.tell((0.0, True))
    await probe.expect_msg("started")  # restarted by the default strategy
    assert ref.is_alive


class TwoFailingTasks(Actor):
    """Each instance starts two tasks that fail together."""

    def __init__(self, built: list[int]) -> None:
        super().__init__()
        built.append(len(built) + 1)
        self.instance = len(built)

    async def pre_start(self) -> None:
        if self.instance == 1:
            gate = asyncio.Event()
            for k in range(2):
                self.context.create_task(self._fail(gate, k))
            gate.set()

    async def _fail(self, gate: asyncio.Event, k: int) -> None:
        await gate.wait()
        raise ValueError(f"task {k} of instance 1")

    def receive(self, message: Any) -> Any:
        return self.instance


async def test_failures_of_an_earlier_instance_do_not_restart_the_new_one() -> None:
    """Both tasks' failures are queued before the first restart: the second
    belongs to the instance that restart replaced (Akka drops it too)."""
    built: list[int] = []
    strategy = OneForOneStrategy(max_restarts=1, within=60)
    async with ActorSystem("t", guardian_strategy=strategy) as system:
        ref = system.spawn(Props(TwoFailingTasks, built))
        await await_condition(lambda: len(built) == 2, timeout=5)
        assert await ref.ask("which?", timeout=5) == 2  # alive: restarted once, not stopped
        assert built == [1, 2]


class TaskFailsWhenCancelled(Actor):
    """Its task raises when cancelled (a failing clean-up); a message fails it."""

    def __init__(self, probe: ActorRef) -> None:
        super().__init__()
        self.probe = probe

    def pre_start(self) -> None:
        self.context.create_task(self._work())
        self.probe.tell("started")

    async def _work(self) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise RuntimeError("clean-up failed") from None

    def receive(self, message: Any) -> Any:
        raise ValueError(message)


@pytest.mark.parametrize("ending", ["restart", "stop"])
async def test_a_task_failing_as_its_actor_restarts_is_logged_as_when_it_stops(
    actor_system: ActorSystem, ending: str
) -> None:
    """Its failure belongs to the instance being replaced, so, as in Akka, it
    restarts nothing; but it is lost, as one while the actor stops is, and
    logged at ERROR the same way (it was DEBUG, with no error named)."""
    probe = TestProbe(actor_system)
    ref = actor_system.spawn(Props(TaskFailsWhenCancelled, probe.ref))
    await probe.expect_msg("started")
    async with expect_log("task of .* died with RuntimeError.*clean-up failed", level="ERROR"):
        if ending == "restart":
            ref.tell("fail")
            await probe.expect_msg("started")
        else:
            await ref.stop()
    assert ref.is_alive == (ending == "restart")


class StoppedAsItsTaskFails(Actor):
    """Its task fails, and it is stopped before it handles that failure."""

    def pre_start(self) -> None:
        task = self.context.create_task(self._fail())
        task.add_done_callback(lambda _: self.context.self_ref.stop())  # after the failure's

    async def _fail(self) -> None:
        await asyncio.sleep(0)
        raise ValueError("lost")

    def receive(self, message: Any) -> Any:
        return message


async def test_a_task_failure_that_a_stop_overtakes_is_logged(actor_system: ActorSystem) -> None:
    """Queued for the actor, but the stop came first: nothing supervises it
    any more, and it is logged as a task dying as its actor stops (it was
    lost with no trace)."""
    probe = TestProbe(actor_system)
    async with expect_log("task of .* died with ValueError.*lost", level="ERROR"):
        ref = actor_system.spawn(Props(StoppedAsItsTaskFails))
        probe.watch(ref)
        await probe.expect_terminated(ref)


async def test_create_task_rejects_non_coroutines(actor_system: ActorSystem) -> None:
    class Bad(Actor):
        def receive(self, message: Any) -> Any:
            self.context.create_task(message)

    ref = actor_system.spawn(Props(Bad))
    with pytest.raises(TypeError, match="coroutine"):
        await ref.ask(42)


class Parent(Actor):
    """Spawns children that answer "parent" with their context's parent."""

    def receive(self, message: Any) -> Any:
        if message in ("spawn", "dup"):
            return self.context.spawn(Props(Parent), name="kid")
        if message == "children":
            return self.context.children
        if message == "parent":
            return self.context.parent
        if message == "context":
            return self.context  # to use outside its handler
        return None


async def test_children_and_parent(actor_system: ActorSystem) -> None:
    parent = actor_system.spawn(Props(Parent), name="p")
    child = await parent.ask("spawn")
    assert child.path == "atomr://test/user/p/kid"
    assert await parent.ask("children") == [child]
    assert await child.ask("parent") is parent
    assert await parent.ask("parent") is None
    with pytest.raises(ValueError, match="already exists"):
        await parent.ask("dup")


class Stasher(Actor):
    """Stashes everything until "open", then handles stashed messages in order."""

    def __init__(self, probe: ActorRef) -> None:
        super().__init__()
        self.probe = probe
        self.open = False

    def receive(self, message: Any) -> Any:
        if message == "open":
            self.open = True
            return self.context.unstash_all()
        if not self.open:
            self.context.stash()
            return None
        self.probe.tell(message)
        return f"handled {message}"


async def test_stash_and_unstash_all(actor_system: ActorSystem) -> None:
    probe = TestProbe(actor_system)
    ref = actor_system.spawn(Props(Stasher, probe.ref))
    ref.tell(1)
    asked = asyncio.ensure_future(ref.ask(2, timeout=2))
    await asyncio.sleep(0)  # the ask is queued once its task runs
    ref.tell(3)
    await probe.expect_no_msg(0.05)
    assert not asked.done()
    assert await ref.ask("open") == 3
    assert await probe.receive_n(3) == [1, 2, 3]
    assert await asked == "handled 2"


class Watcher(Actor):
    def __init__(self, probe: ActorRef) -> None:
        super().__init__()
        self.probe = probe

    def receive(self, message: Any) -> Any:
        if isinstance(message, Terminated):
            self.probe.tell(("terminated", message.ref))
        elif message[0] == "watch":
            self.context.watch(message[1])
        elif message[0] == "watch twice":
            self.context.watch(message[1])
            self.context.watch(message[1])
        elif message[0] == "unwatch":
            self.context.unwatch(message[1])
        return None


async def test_watch_gets_terminated(actor_system: ActorSystem) -> None:
    probe = TestProbe(actor_system)
    watcher = actor_system.spawn(Props(Watcher, probe.ref))
    target = actor_system.spawn(Props(Echo))
    await watcher.ask(("watch", target))
    target.stop()
    await probe.expect_msg(("terminated", target))
    # watching an already stopped actor answers at once
    await watcher.ask(("watch", target))
    await probe.expect_msg(("terminated", target))
    # once, however often it is watched before that answer is received (Akka)
    await watcher.ask(("watch twice", target))
    await probe.expect_msg(("terminated", target))
    await watcher.ask(("sync",))
    await probe.expect_no_msg(0.05)


async def test_unwatch(actor_system: ActorSystem) -> None:
    probe = TestProbe(actor_system)
    watcher = actor_system.spawn(Props(Watcher, probe.ref))
    target = actor_system.spawn(Props(Echo))
    await watcher.ask(("watch", target))
    await watcher.ask(("unwatch", target))
    await target.stop()
    await probe.expect_no_msg(0.05)


class WatchesItsChildren(Actor):
    def pre_start(self) -> None:
        for _ in range(3):
            self.context.watch(self.context.spawn(Props(Echo)))

    def receive(self, message: Any) -> Any:
        return message


async def test_a_stopping_watcher_gets_no_terminated_of_its_children(
    actor_system: ActorSystem,
) -> None:
    # its children stop first, while it takes no more messages: as in Akka, a
    # terminating actor is not told (was: a dead letter for each child)
    parent = actor_system.spawn(Props(WatchesItsChildren))
    await parent.ask("started")
    await parent.stop()
    assert list(actor_system.dead_letters.recent) == []


class Router(Actor):
    def __init__(self, target: ActorRef) -> None:
        super().__init__()
        self.target = target

    def receive(self, message: Any) -> Any:
        self.context.forward(self.target)
        return "ignored"


async def test_forward_keeps_ask_and_sender(actor_system: ActorSystem) -> None:
    probe = TestProbe(actor_system)
    target = actor_system.spawn(Props(Forwarder, probe.ref))
    await probe.expect_msg(("pre_start", ""))
    ref = actor_system.spawn(Props(Router, target))
    assert await ref.ask("x") == "x"
    await probe.expect_msg("x")


class Stuck(Actor):
    def __init__(self, busy: asyncio.Event) -> None:
        super().__init__()
        self.busy = busy

    async def receive(self, message: Any) -> Any:
        self.busy.set()
        await asyncio.sleep(3600)


async def test_forward_refused_by_full_mailbox_fails_the_ask(actor_system: ActorSystem) -> None:
    busy = asyncio.Event()
    target = actor_system.spawn(Props(Stuck, busy).with_mailbox(BoundedMailbox(1)))
    target.tell("busy")
    await asyncio.wait_for(busy.wait(), 5)  # "busy" is out of the mailbox
    target.tell("queued")  # the mailbox is now full (policy FAIL)
    ref = actor_system.spawn(Props(Router, target))
    with pytest.raises(MailboxFullError):
        await ref.ask("x", timeout=5)  # was: no answer until the ask timed out


class FansOut(Actor):
    def __init__(self, targets: list[ActorRef]) -> None:
        super().__init__()
        self.targets = targets

    def receive(self, message: Any) -> Any:
        self.context.forward(*self.targets)


@pytest.mark.parametrize("lost", ["stopped", "mailbox full"])
async def test_forward_to_several_leaves_the_ask_to_those_that_take_it(
    actor_system: ActorSystem, lost: str
) -> None:
    # a stopped ref, or a full DROP_NEWEST mailbox, failed the shared ask at
    # once (ActorStoppedError, MailboxFullError) though another ref took it
    if lost == "stopped":
        gone = actor_system.spawn(Props(Echo))
        await gone.stop()
    else:
        busy = asyncio.Event()
        mailbox = BoundedMailbox(1, OverflowPolicy.DROP_NEWEST)
        gone = actor_system.spawn(Props(Stuck, busy).with_mailbox(mailbox))
        gone.tell("busy")
        await asyncio.wait_for(busy.wait(), 5)
        gone.tell("queued")  # full
    fans_out = actor_system.spawn(Props(FansOut, [gone, actor_system.spawn(Props(Echo))]))
    assert await fans_out.ask("x", timeout=5) == "x"
    letters = [(d.message, d.recipient, d.reason) for d in actor_system.dead_letters.recent]
    assert letters == [("x", gone, lost)]


async def test_forward_to_several_all_stopped_fails_the_ask_at_once(
    actor_system: ActorSystem,
) -> None:
    gone = [actor_system.spawn(Props(Echo)) for _ in range(2)]
    for ref in gone:
        await ref.stop()
    fans_out = actor_system.spawn(Props(FansOut, gone))
    with pytest.raises(ActorStoppedError, match="stopped"):
        await fans_out.ask("x", timeout=5)
    assert [d.recipient for d in actor_system.dead_letters.recent] == gone


async def test_context_outside_handler_errors(actor_system: ActorSystem) -> None:
    with pytest.raises(RuntimeError, match="not created by spawn"):
        _ = Echo().context
    ref = actor_system.spawn(Props(Parent))
    ctx = await ref.ask("context")
    with pytest.raises(RuntimeError, match="while handling"):
        ctx.defer()
    with pytest.raises(RuntimeError, match="while handling"):
        ctx.stash()


class CleanupFails(Actor):
    """Starts a task whose cleanup raises when the actor stops and cancels it."""

    async def work(self) -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            raise KeyError("cleanup failed")

    def receive(self, message: Any) -> Any:
        self.context.create_task(self.work())


async def test_task_error_while_stopping_is_logged(
    actor_system: ActorSystem, caplog: pytest.LogCaptureFixture
) -> None:
    ref = actor_system.spawn(Props(CleanupFails))
    await ref.ask("start")
    await asyncio.sleep(0)
    await ref.stop()
    assert any("cleanup failed" in r.getMessage() for r in caplog.records)  # was: silent


@pytest.mark.parametrize("method", ["stop", "watch", "unwatch", "forward"])
async def test_context_methods_refuse_a_non_ref_with_type_error(actor_system, method) -> None:
    seen: list[BaseException] = []

    class Caller(Actor):
        def receive(self, message):
            try:
                getattr(self.context, method)("not a ref")
            except Exception as exc:  # noqa: BLE001 - the test inspects it
                seen.append(exc)
            return "done"

    ref = actor_system.spawn(Props(Caller))
    assert await ref.ask("go") == "done"
    assert len(seen) == 1 and isinstance(seen[0], TypeError), seen
    assert f"{method}() takes an ActorRef, got str" in str(seen[0])


class StashesTwice(Actor):
    """Stashes ("twice", x, between) twice in one handling (the second is
    refused), until "open"; ``between`` ("defer", "forward" or None) passes
    the ask on between the two."""

    def __init__(self, probe: ActorRef) -> None:
        super().__init__()
        self.probe = probe

    def receive(self, message: Any) -> Any:
        if message == "open":
            return self.context.unstash_all()
        if message[0] == "twice":
            self.context.stash()
            if message[2] == "defer":
                self.context.defer()
            elif message[2] == "forward":
                self.context.forward(self.probe)
            try:
                self.context.stash()
            except RuntimeError as error:
                self.probe.tell(str(error))
            return None
        self.probe.tell(message)
        return None


@pytest.mark.parametrize("between", [None, "defer", "forward"])
async def test_a_message_is_stashed_at_most_once(
    actor_system: ActorSystem, between: str | None
) -> None:
    probe = TestProbe(actor_system)
    ref = actor_system.spawn(Props(StashesTwice, probe.ref))
    ref.tell(("twice", 1, between))
    if between == "forward":
        await probe.expect_msg(("twice", 1, between))
    assert "already stashed" in await probe.expect_msg_type(str)
    assert await ref.ask("open") == 1  # was: 2, and the message handled twice
    if between == "forward":
        await probe.expect_msg(("twice", 1, between))
    assert "already stashed" in await probe.expect_msg_type(str)  # its one new handling
    assert await ref.ask("open") == 1


class GatedWatcher(Actor):
    """Watches ``target``; on ("hold", gate) waits for ``gate``, then unwatches it."""

    def __init__(self, probe: ActorRef, target: ActorRef) -> None:
        super().__init__()
        self.probe = probe
        self.target = self.context.watch(target)

    async def receive(self, message: Any) -> Any:
        if isinstance(message, Terminated):
            self.probe.tell(("terminated", message.ref))
        elif message[0] == "hold":
            self.probe.tell("holding")
            await message[1]
            self.context.unwatch(self.target)
        return None


async def test_unwatch_discards_a_terminated_already_queued(actor_system: ActorSystem) -> None:
    probe = TestProbe(actor_system)
    target = actor_system.spawn(Props(Echo))
    watcher = actor_system.spawn(Props(GatedWatcher, probe.ref, target))
    gate = asyncio.get_running_loop().create_future()
    watcher.tell(("hold", gate))
    await probe.expect_msg("holding")
    await target.stop()  # Terminated(target) is now queued behind "hold"
    gate.set_result(None)  # the handler unwatches: the queued Terminated goes
    await watcher.ask(("sync",))
    await probe.expect_no_msg(0.01)


class StashesTerminated(Actor):
    """Watches ``target`` and stashes its ``Terminated``; ``order`` says whether
    "release" unwatches before or after ``unstash_all``."""

    def __init__(self, probe: ActorRef, target: ActorRef, order: str) -> None:
        super().__init__()
        self.probe = probe
        self.order = order
        self.released = False
        self.target = self.context.watch(target)

    def receive(self, message: Any) -> Any:
        if isinstance(message, Terminated):
            if not self.released:
                self.context.stash()
                self.probe.tell("stashed")
            else:
                self.probe.tell("terminated")
        elif message == "release":
            self.released = True
            if self.order == "unwatch first":
                self.context.unwatch(self.target)
                self.context.unstash_all()
            else:
                self.context.unstash_all()
                self.context.unwatch(self.target)
        return None


@pytest.mark.parametrize(
    ("order", "delivered"), [("unwatch first", True), ("unstash first", False)]
)
async def test_a_stashed_terminated_is_discarded_by_unwatch_only_once_unstashed(
    actor_system: ActorSystem, order: str, delivered: bool
) -> None:
    """As Akka: stashed, it is the actor's own; unstashed, it is queued again."""
    probe = TestProbe(actor_system)
    target = actor_system.spawn(Props(Echo))
    watcher = actor_system.spawn(Props(StashesTerminated, probe.ref, target, order))
    await target.stop()
    await probe.expect_msg("stashed")
    await watcher.ask("release")
    await watcher.ask("sync")
    if delivered:
        await probe.expect_msg("terminated")
    await probe.expect_no_msg(0.01)


class Payload:
    """A message a weak reference can follow."""


async def test_a_timed_out_deferred_reply_is_freed_at_once(actor_system: ActorSystem) -> None:
    ref = actor_system.spawn(Props(Coordinator))
    payload = Payload()
    alive = weakref.ref(payload)
    try:
        await ref.ask(("get", "key", payload), timeout=0.01)  # the actor keeps the Reply
    except AskTimeoutError:
        pass
    else:
        raise AssertionError("the deferred ask was answered")
    del payload
    await asyncio.sleep(0)  # the handle that woke this test holds the ask's future
    gc.collect()
    assert alive() is None  # was: kept (with its ask) until the actor stopped
    assert ref.is_alive
