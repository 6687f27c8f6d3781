"""tell, ask and send from other threads and other event loops; what refuses at once."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Coroutine, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import pytest

from atomr import (
    Actor,
    ActorRef,
    ActorStoppedError,
    ActorSystem,
    AskTimeoutError,
    BoundedMailbox,
    DeadLetter,
    Mailbox,
    OverflowPolicy,
    Props,
)
from atomr.testkit import TestProbe, await_condition

from .actors import Echo

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[2]


class LoopThread:
    """An event loop running in a thread of its own, as a service would host one."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 10) -> T:
        """Run ``coro`` there and wait for its result here."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def elsewhere() -> Iterator[tuple[LoopThread, ActorSystem]]:
    """An ActorSystem running on another thread's loop."""
    host = LoopThread()
    system = ActorSystem("elsewhere")
    try:
        yield host, system
    finally:
        host.run(system.terminate(timeout=10))
        host.close()


async def _spawn(system: ActorSystem, props: Props) -> ActorRef:
    return system.spawn(props)


class Collector(Actor):
    """Resolves ``done`` with every message once it has ``n`` of them."""

    def __init__(self, n: int, done: asyncio.Future[list[Any]]) -> None:
        super().__init__()
        self.n = n
        self.done = done
        self.seen: list[Any] = []

    def receive(self, message: Any) -> Any:
        self.seen.append(message)
        if len(self.seen) == self.n:
            self.done.set_result(self.seen)


def in_thread(work: Any) -> threading.Thread:
    thread = threading.Thread(target=work)
    thread.start()
    return thread


class Signals(Actor):
    """Sets a thread's event for each message."""

    def __init__(self, handled: threading.Event) -> None:
        super().__init__()
        self.handled = handled

    def receive(self, message: Any) -> None:
        self.handled.set()


async def test_tell_from_a_plain_thread_wakes_an_idle_actor(actor_system: ActorSystem) -> None:
    loop = asyncio.get_running_loop()
    handled, finished = threading.Event(), asyncio.Event()
    ref = actor_system.spawn(Props(Signals, handled))
    await asyncio.sleep(0)  # the actor starts and waits for messages
    prompt: list[bool] = []

    def client() -> None:
        # give the loop time to fall asleep in select(): nothing is due on it for
        # 60 s, so only a thread-safe wake-up gets the message handled (this pause
        # sets the scene; it cannot make a correct runtime fail)
        time.sleep(0.2)
        ref.tell("from a thread")
        prompt.append(handled.wait(10))  # was: False, the loop slept on
        loop.call_soon_threadsafe(finished.set)

    threading.Thread(target=client).start()
    await asyncio.wait_for(finished.wait(), 60)
    assert prompt == [True]


async def test_many_threads_tell_without_loss_in_per_thread_order(
    actor_system: ActorSystem,
) -> None:
    done = asyncio.get_running_loop().create_future()
    ref = actor_system.spawn(Props(Collector, 4 * 5000, done))

    def sender(k: int) -> None:
        for i in range(5000):
            ref.tell((k, i))

    threads = [in_thread(lambda k=k: sender(k)) for k in range(4)]
    seen = await asyncio.wait_for(done, 30)
    for thread in threads:
        thread.join()
    for k in range(4):
        assert [i for s, i in seen if s == k] == list(range(5000))


DEBUG_MODE = """
import asyncio, threading
from atomr import ActorSystem, Props
from tests.actor.test_threads import Collector

async def main():
    done = asyncio.get_running_loop().create_future()
    async with ActorSystem("debug") as system:
        ref = system.spawn(Props(Collector, 2, done))
        await asyncio.sleep(0)
        thread = threading.Thread(target=lambda: (ref.tell(1), ref.tell(2)))
        thread.start()
        thread.join()
        print(await asyncio.wait_for(done, 5))

asyncio.run(main(), debug=True)
"""


def test_tell_from_a_thread_in_asyncio_debug_mode() -> None:
    """Debug mode checks thread safety: a tell from a thread must pass it. (In a
    process of its own: the bug wedged the actor's task, and the loop with it.)"""
    result = subprocess.run(
        [sys.executable, "-c", DEBUG_MODE],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr  # was: "Non-thread-safe operation"
    assert result.stdout.strip() == "[1, 2]"


async def test_tell_from_a_thread_to_a_full_or_stopped_actor_is_a_dead_letter(
    actor_system: ActorSystem,
) -> None:
    loop = asyncio.get_running_loop()
    letters: asyncio.Queue[Any] = asyncio.Queue()
    actor_system.dead_letters.subscribe(lambda letter: letters.put_nowait(letter))
    gate = asyncio.Event()
    bounded = actor_system.spawn(Props(Gate, gate).with_mailbox(BoundedMailbox(1)))
    bounded.tell("in hand")
    await asyncio.sleep(0)
    stopped = actor_system.spawn(Props(Echo))
    await stopped.stop()
    await loop.run_in_executor(None, lambda: [bounded.tell(i) for i in range(2)])
    await loop.run_in_executor(None, lambda: stopped.tell("late"))
    got = [await asyncio.wait_for(letters.get(), 5) for _ in range(2)]
    assert {(d.message, d.reason) for d in got} == {(1, "mailbox full"), ("late", "stopped")}
    gate.set()


class Gate(Actor):
    def __init__(self, gate: asyncio.Event) -> None:
        super().__init__()
        self.gate = gate

    async def receive(self, message: Any) -> Any:
        await self.gate.wait()
        return message


class Silent(Actor):
    def receive(self, message: Any) -> None:
        self.context.defer()


async def test_ask_and_send_from_another_loop(
    elsewhere: tuple[LoopThread, ActorSystem],
) -> None:
    host, system = elsewhere
    echo = host.run(_spawn(system, Props(Echo)))
    assert await echo.ask("across loops", timeout=5) == "across loops"  # was: RuntimeError
    with pytest.raises(ValueError, match="bad"):
        await echo.ask(ValueError("bad"), timeout=5)
    silent = host.run(_spawn(system, Props(Silent)))
    with pytest.raises(AskTimeoutError, match="timed out after 0.05"):
        await silent.ask("x", timeout=0.05)
    bounded = host.run(
        _spawn(
            system,
            Props(Echo).with_mailbox(BoundedMailbox(1, OverflowPolicy.BACK_PRESSURE)),
        )
    )
    await bounded.send("room", timeout=5)
    assert await bounded.ask("after", timeout=5) == "after"


def test_ask_from_a_plain_thread_with_asyncio_run(
    elsewhere: tuple[LoopThread, ActorSystem],
) -> None:
    host, system = elsewhere
    echo = host.run(_spawn(system, Props(Echo)))
    assert asyncio.run(echo.ask("from a sync thread", timeout=5)) == "from a sync thread"
    answer: Future[Any] = asyncio.run_coroutine_threadsafe(echo.ask("threadsafe"), host.loop)
    assert answer.result(5) == "threadsafe"


def test_system_loop_is_readable_from_a_plain_thread(
    elsewhere: tuple[LoopThread, ActorSystem],
) -> None:
    """docs/actors.md's recipe for synchronous code (a Flask or Django
    thread): `system.loop` raised RuntimeError there, so the recipe failed
    and left the ask's coroutine never awaited."""
    host, system = elsewhere
    echo = host.run(_spawn(system, Props(Echo)))
    assert system.loop is host.loop
    answer: Future[Any] = asyncio.run_coroutine_threadsafe(echo.ask("recipe"), system.loop)
    assert answer.result(5) == "recipe"
    with pytest.raises(RuntimeError, match="another event loop"):
        system.spawn(Props(Echo))  # what only its loop may do is still refused


def test_an_unbound_system_has_no_loop_outside_one() -> None:
    with pytest.raises(RuntimeError, match="needs a running event loop"):
        ActorSystem("unbound").loop  # noqa: B018


async def test_what_refuses_other_threads_says_so_at_once(
    elsewhere: tuple[LoopThread, ActorSystem],
) -> None:
    host, system = elsewhere
    echo = host.run(_spawn(system, Props(Echo)))
    with pytest.raises(RuntimeError, match="another thread.*PoisonPill"):
        echo.stop()
    with pytest.raises(RuntimeError, match="another event loop"):
        system.spawn(Props(Echo))
    with pytest.raises(RuntimeError, match="another event loop"):
        await system.terminate()


class ReachesAcross(Actor):
    """Calls one Context verb (``stop``, ``watch``, ``forward``) on ``target``
    and answers with what it raised."""

    def __init__(self, target: ActorRef) -> None:
        super().__init__()
        self.target = target

    def receive(self, verb: str) -> Any:
        try:
            getattr(self.context, verb)(self.target)
        except RuntimeError as error:
            return str(error)
        return "reached"


@pytest.mark.parametrize(
    ("verb", "instead"),
    [("stop", "PoisonPill"), ("watch", "within one loop"), ("forward", "ask it")],
)
async def test_context_verbs_refuse_an_actor_on_another_loop(
    elsewhere: tuple[LoopThread, ActorSystem], actor_system: ActorSystem, verb: str, instead: str
) -> None:
    # forward() delivered into the other loop's mailbox from this thread (an
    # ask without a timeout then hung); watch()'s Terminated came seconds late
    host, system = elsewhere
    echo = host.run(_spawn(system, Props(Echo)))
    here = actor_system.spawn(Props(ReachesAcross, echo))
    said = await here.ask(verb, timeout=5)
    assert f"{verb}() of {echo.path} (Echo): it lives on another thread's event loop" in said
    assert instead in said
    assert await echo.ask("still there", timeout=5) == "still there"


async def test_a_closed_loop_refuses_at_once() -> None:
    host = LoopThread()
    system = await asyncio.to_thread(ActorSystem, "closing")  # not bound to this loop
    echo = host.run(_spawn(system, Props(Echo)))
    # answered: the actor is idle, waiting for the next message
    assert host.run(echo.ask("hello", timeout=5)) == "hello"
    host.loop.set_exception_handler(lambda loop, context: None)  # its task dies with it
    host.close()  # without terminating the system: its loop is gone
    with pytest.raises(ActorStoppedError, match="event loop is closed"):
        await echo.ask("anyone?", timeout=1)
    with pytest.raises(ActorStoppedError, match="event loop is closed"):
        echo.tell("anyone?")


class _Hangs(Actor):
    """Answers, except "hang", which it never finishes."""

    async def receive(self, message: Any) -> Any:
        if message == "hang":
            await asyncio.get_running_loop().create_future()
        return message


@pytest.mark.parametrize("busy", [False, True])
def test_a_loop_closed_under_an_actor_refuses_on_its_own_thread_too(busy: bool) -> None:
    """A host that closes its loop without terminating, then asks again from a
    new loop on the same thread: ActorStoppedError (was asyncio's "Event loop
    is closed", and later tells were lost without a dead letter), whether the
    actor was idle or in a handler when its loop closed."""
    kept: dict[str, Any] = {}

    async def first() -> None:
        kept["system"] = system = ActorSystem("closed-here")
        kept["echo"] = system.spawn(Props(_Hangs))
        assert await kept["echo"].ask("hello", timeout=5) == "hello"
        if busy:
            kept["echo"].tell("hang")
            await asyncio.sleep(0)  # it starts the handler

    loop = asyncio.new_event_loop()
    loop.set_exception_handler(lambda loop, context: None)  # its task dies with it
    loop.run_until_complete(first())
    loop.close()

    async def second() -> None:
        echo = kept["echo"]
        with pytest.raises(ActorStoppedError, match="event loop is closed"):
            await echo.ask("anyone?", timeout=1)
        echo.tell("anyone?")  # a dead letter, not lost
        assert [letter.message for letter in kept["system"].dead_letters.recent][-1] == "anyone?"

    asyncio.run(second())


class _Seen(Actor):
    """Records, in its constructor, whose context it was given."""

    def __init__(self, seen: list[tuple[str, str]], system: str) -> None:
        super().__init__()
        seen.append((system, str(self.context.self_ref.path)))

    def receive(self, message: Any) -> Any:
        return message


def test_systems_on_two_threads_build_actors_at_once_each_with_its_own_context() -> None:
    """Thread b is inside its factory (its actor is being built) when thread
    a's actor is constructed: a's `__init__` must still see a's context."""
    seen: list[tuple[str, str]] = []
    b_building, a_built = threading.Event(), threading.Event()

    def factory_b() -> _Seen:
        b_building.set()
        assert a_built.wait(10)
        return _Seen(seen, "b")

    def factory_a() -> _Seen:
        assert b_building.wait(10)
        try:
            return _Seen(seen, "a")
        finally:
            a_built.set()

    async def spawn_in(name: str, factory: Any) -> str:
        async with ActorSystem(name) as system:
            ref = system.spawn(Props(factory), name="worker")
            return str(await ref.ask("ok", timeout=10))

    results: dict[str, Any] = {}
    threads = [
        threading.Thread(target=lambda n=n, f=f: results.update({n: asyncio.run(spawn_in(n, f))}))
        for n, f in (("a", factory_a), ("b", factory_b))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == {"a": "ok", "b": "ok"}
    assert sorted(seen) == [("a", "atomr://a/user/worker"), ("b", "atomr://b/user/worker")]


class _HeldQueue(deque[Any]):
    """A mailbox queue whose first append from a thread other than ``owner``
    sets ``arrived`` and then waits for ``go``: the teller has read the actor
    as accepting its message, and queues it only once the test lets it."""

    def __init__(self, owner: int, arrived: threading.Event, go: threading.Event) -> None:
        super().__init__()
        self.owner = owner
        self.arrived = arrived
        self.go = go
        self.held = False

    def append(self, item: Any) -> None:
        if not self.held and threading.get_ident() != self.owner:
            self.held = True
            self.arrived.set()
            self.go.wait(10)
        super().append(item)


class _HeldMailbox(Mailbox):
    """An unbounded mailbox with a ``_HeldQueue``."""

    def __init__(self, owner: int, arrived: threading.Event, go: threading.Event) -> None:
        super().__init__()
        self.held = (owner, arrived, go)
        self.queue = _HeldQueue(owner, arrived, go)

    def copy(self) -> Mailbox:
        return _HeldMailbox(*self.held)


async def test_a_tell_from_a_thread_that_the_actors_stop_overtakes_is_a_dead_letter(
    actor_system: ActorSystem,
) -> None:
    # The thread reads the actor as accepting, the actor stops and fails its
    # queue, then the thread queues the message.
    loop = asyncio.get_running_loop()
    letters: list[DeadLetter] = []
    actor_system.dead_letters.subscribe(letters.append)
    arrived, go = threading.Event(), threading.Event()
    mailbox = _HeldMailbox(threading.get_ident(), arrived, go)
    ref = actor_system.spawn(Props(Echo).with_mailbox(mailbox))
    teller = in_thread(lambda: ref.tell("late"))
    assert await loop.run_in_executor(None, arrived.wait, 10)
    await ref.stop()
    go.set()
    await loop.run_in_executor(None, teller.join, 10)
    await await_condition(  # was: lost, neither handled nor a dead letter
        lambda: [(d.message, d.reason) for d in letters] == [("late", "stopped")],
        timeout=10,
        message="the late tell is a dead letter",
    )


class _StopsOnFirst(Actor):
    """Records each message, and stops itself on the first one."""

    def __init__(self, handled: list[Any]) -> None:
        super().__init__()
        self.handled = handled

    def receive(self, message: Any) -> None:
        self.handled.append(message)
        if len(self.handled) == 1:
            self.context.stop(self.context.self_ref)


class _Garbage:
    """A reference cycle with a finalizer: the cyclic collector runs Python
    code (``__del__``) wherever it is set off, so a thread can be switched
    out there, between a tell's check of the actor and its append (under
    the GIL of CPython 3.11, the one such point)."""

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        pass


def _tell_until_stopped(ref: ActorRef, attempt: int, sent: list[Any]) -> None:
    """Tell ``ref`` numbered messages until it stops (at most a million),
    leaving cyclic garbage behind."""
    for i in range(1_000_000):
        if not ref.is_alive:
            break
        _Garbage()
        message = (attempt, i)
        ref.tell(message)
        sent.append(message)


async def test_every_tell_from_a_thread_while_the_actor_stops_is_handled_or_a_dead_letter(
    actor_system: ActorSystem,
) -> None:
    # A thread tells in a loop while the actor stops itself on its first
    # message; bounded by message counts, not by time. The loop takes over
    # when the thread is switched out, at any point of a tell, and stops the
    # actor before the thread runs again (on the old code about one attempt
    # in ten lost the thread's last message).
    loop = asyncio.get_running_loop()
    dead: list[Any] = []
    actor_system.dead_letters.subscribe(lambda letter: dead.append(letter.message))
    for attempt in range(30):
        handled: list[Any] = []
        sent: list[Any] = []
        ref = actor_system.spawn(Props(_StopsOnFirst, handled))
        teller = in_thread(lambda ref=ref, a=attempt, sent=sent: _tell_until_stopped(ref, a, sent))
        await loop.run_in_executor(None, teller.join, 60)
        await ref.stop()

        def accounted(attempt: int = attempt, handled: list[Any] = handled) -> list[Any]:
            return sorted(handled + [m for m in dead if m[0] == attempt])

        await await_condition(  # was: a message now and then in neither
            lambda accounted=accounted, sent=sent: accounted() == sent,
            timeout=10,
            message=f"attempt {attempt}: every message handled or dead-lettered",
        )


class AnswersFromAThread(Actor):
    """Defers each ask and answers it from a new thread: ``("ok", v)`` with
    ``v``, ``("fail", e)`` with ``e``; what each setter returned or raised
    goes into ``outcomes``."""

    def __init__(self, outcomes: Future[Any]) -> None:
        super().__init__()
        self.outcomes = outcomes

    def receive(self, message: Any) -> None:
        reply, (verb, value) = self.context.defer(), message

        def answer() -> None:
            try:
                setter = reply.set_result if verb == "ok" else reply.set_exception
                self.outcomes.set_result(setter(value))
            except BaseException as error:
                self.outcomes.set_exception(error)

        threading.Thread(target=answer).start()


@pytest.mark.parametrize("verb", ["ok", "fail"])
async def test_a_deferred_reply_may_be_answered_from_another_thread(
    actor_system: ActorSystem, verb: str
) -> None:
    """The answer is handed over to the actor's loop. It used to be set on
    the asker's future from the thread itself: asyncio's debug mode refuses
    that (RuntimeError), and otherwise the asker woke only when something
    else woke the loop (its ask timeout, here)."""
    loop = asyncio.get_running_loop()
    debug = loop.get_debug()
    loop.set_debug(True)  # asyncio then refuses a cross-thread set_result
    try:
        outcomes: Future[Any] = Future()
        ref = actor_system.spawn(Props(AnswersFromAThread, outcomes))
        asked = asyncio.ensure_future(
            ref.ask((verb, "v" if verb == "ok" else KeyError("k")), timeout=30)
        )
        assert await asyncio.wait_for(asyncio.wrap_future(outcomes), 10) is True
        if verb == "ok":
            assert await asyncio.wait_for(asked, 10) == "v"
        else:
            with pytest.raises(KeyError):
                await asyncio.wait_for(asked, 10)
    finally:
        loop.set_debug(debug)


class ToldFromAThreadWhenLookedAt:
    """A message that, the first time the runtime reads its class, has another
    thread tell ``ref`` and waits for it: a thread's tell landing at that very
    moment, made certain."""

    def __init__(self, ref: ActorRef) -> None:
        self.ref = ref
        self.told = False

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        if not self.told:
            self.told = True
            in_thread(lambda: self.ref.tell("late")).join()
        return ToldFromAThreadWhenLookedAt


class WatchesOnRequest(Actor):
    def receive(self, message: Any) -> None:
        if isinstance(message, ActorRef):
            self.context.watch(message)
            sender = self.context.sender
            assert sender is not None
            sender.tell("watched")


async def test_watching_a_stopped_actor_while_a_thread_tells_the_watcher(
    actor_system: ActorSystem,
) -> None:
    # watch() looks for a Terminated already queued; it iterated the mailbox
    # itself, and a thread's tell meanwhile raised "deque mutated during
    # iteration" in the handler (the watcher failed and restarted)
    probe = TestProbe(actor_system)
    stopped = actor_system.spawn(Props(Echo))
    await stopped.stop()
    watcher = actor_system.spawn(Props(WatchesOnRequest))
    watcher.tell(stopped, sender=probe.ref)
    watcher.tell(ToldFromAThreadWhenLookedAt(watcher))  # queued behind it
    await probe.expect_msg("watched")


async def test_a_system_timer_refuses_an_actor_on_another_loop(
    elsewhere: tuple[LoopThread, ActorSystem], actor_system: ActorSystem
) -> None:
    # its tick was queued into the other loop's mailbox from this thread:
    # asyncio's debug mode refused it there (the tick lost), and otherwise
    # it waited for something else to wake that loop
    host, system = elsewhere
    echo = host.run(_spawn(system, Props(Echo)))
    with pytest.raises(RuntimeError, match=r"schedule_once\(\) of .* another thread's event loop"):
        actor_system.schedule_once(0, echo, "tick")
    assert await echo.ask("still there", timeout=5) == "still there"
