"""ActorSystem: spawn validation, orderly termination, event loops."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sys
import weakref
from typing import Any

import pytest
import uvloop

import atomr
from atomr import (
    Actor,
    ActorNameTakenError,
    ActorRef,
    ActorStoppedError,
    ActorSystem,
    InvalidActorNameError,
    PoisonPill,
    Props,
)
from atomr.testkit import TestProbe, await_condition

from .actors import Echo


class Node(Actor):
    """Spawns ``depth`` levels of ``width`` children; logs post_stop into ``log``."""

    def __init__(self, log: list[str], depth: int, width: int = 2) -> None:
        super().__init__()
        self.log = log
        for i in range(width if depth else 0):
            self.context.spawn(Props(Node, log, depth - 1, width), name=f"n{i}")

    async def post_stop(self) -> None:
        await asyncio.sleep(0)
        self.log.append(self.context.self_ref.path)

    def receive(self, message: Any) -> Any:
        return message


class Sleeper(Actor):
    async def receive(self, message: Any) -> Any:
        await asyncio.sleep(3600)


async def test_terminate_children_before_parents_no_pending_tasks() -> None:
    log: list[str] = []
    system = ActorSystem("t")
    roots = [system.spawn(Props(Node, log, 2), name=f"root{i}") for i in range(2)]
    sleeper = system.spawn(Props(Sleeper))
    sleeper.tell("nap")
    await roots[0].ask("ready")
    await system.terminate()
    assert len(log) == 2 * 7
    for path in log:  # every post_stop ran after those of its descendants
        assert not any(other.startswith(path + "/") for other in log[log.index(path) + 1 :])
    assert not any(r.is_alive for r in roots)
    pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert pending == []
    assert system.is_terminated
    with pytest.raises(RuntimeError, match="terminated"):
        system.spawn(Props(Echo))
    await system.terminate()  # idempotent


async def test_stop_waits_for_children(actor_system: ActorSystem) -> None:
    log: list[str] = []
    root = actor_system.spawn(Props(Node, log, 1), name="r")
    await root.stop()
    assert log[-1] == "atomr://test/user/r" and len(log) == 3


async def test_spawn_bad_input(actor_system: ActorSystem) -> None:
    actor_system.spawn(Props(Echo), name="dup")
    with pytest.raises(ActorNameTakenError, match="dup"):
        actor_system.spawn(Props(Echo), name="dup")
    with pytest.raises(TypeError, match=r"wrap the class: Props\(Echo\)"):
        actor_system.spawn(Echo)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="expects Props"):
        actor_system.spawn("echo")  # type: ignore[arg-type]
    actor_system.spawn(Props(Echo), name="n" * 255)
    for ok in ("worker-0", "stage 1", "Ärger:@&=+,.!~*';", "..x"):
        actor_system.spawn(Props(Echo), name=ok)
    hostile = ("a\nforged log line", "nul\x00", "\u202eevil", ".", "..", "a#b", "a?b")
    for bad in ("", "a/b", "$x", " x", "n" * 256, *hostile):
        with pytest.raises(InvalidActorNameError):
            actor_system.spawn(Props(Echo), name=bad)
    with pytest.raises(InvalidActorNameError):
        actor_system.spawn(Props(Echo), name=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="callable"):
        Props(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not an Actor"):
        actor_system.spawn(Props(lambda: object()))  # type: ignore[arg-type,return-value]


async def test_name_free_again_after_stop(actor_system: ActorSystem) -> None:
    ref = actor_system.spawn(Props(Echo), name="again")
    await ref.stop()
    assert actor_system.spawn(Props(Echo), name="again").is_alive


async def test_factory_error_raised_by_spawn(actor_system: ActorSystem) -> None:
    class Broken(Actor):
        def __init__(self) -> None:
            raise ValueError("bad config")

    with pytest.raises(ValueError, match="bad config"):
        actor_system.spawn(Props(Broken), name="broken")
    assert actor_system.actors == []  # nothing half-registered


def test_spawn_without_running_loop() -> None:
    system = ActorSystem()
    with pytest.raises(RuntimeError, match="running event loop"):
        system.spawn(Props(Echo))


def test_bad_system_name() -> None:
    with pytest.raises(ValueError):
        ActorSystem("")
    with pytest.raises(TypeError):
        ActorSystem(1)  # type: ignore[arg-type]
    # the first element of every path, by the rule of actor names (a newline
    # forged log lines; '#', '?', padding or 10 000 characters were taken)
    for bad in ("a/b", "two\nlines", "a#b", "a?b", " padded", "..", "x" * 256):
        with pytest.raises(InvalidActorNameError, match="system name"):
            ActorSystem(bad)
    assert ActorSystem("$ok").name == "$ok"  # '$' is reserved in actor names only


async def _ping_main() -> tuple[str, Any]:
    async with ActorSystem() as system:
        ref: ActorRef = system.spawn(Props(Echo))
        reply = await ref.ask("ping", timeout=1)
    with pytest.raises(ActorStoppedError):
        await ref.ask("late")
    loop = asyncio.get_running_loop()
    return type(loop).__module__, reply


def test_runs_on_uvloop() -> None:
    module, reply = atomr.run(_ping_main())
    assert module.startswith("uvloop") and reply == "ping"


def test_runs_on_plain_asyncio() -> None:
    module, reply = atomr.run(_ping_main(), use_uvloop=False)
    assert module.startswith("asyncio") and reply == "ping"
    module, reply = asyncio.run(_ping_main())
    assert module.startswith("asyncio")


def test_embedded_in_foreign_loop() -> None:
    loop = uvloop.new_event_loop()
    try:
        service = loop.create_task(asyncio.sleep(0.05))  # the host's own work
        module, reply = loop.run_until_complete(_ping_main())
        loop.run_until_complete(service)
    finally:
        loop.close()
    assert reply == "ping" and service.done()


def test_run_rejects_non_coroutine() -> None:
    with pytest.raises(TypeError, match="coroutine"):
        atomr.run(_ping_main)  # type: ignore[arg-type]


def test_public_names_exported() -> None:
    names = [
        "Actor",
        "ActorRef",
        "ActorSystem",
        "Props",
        "Context",
        "Failure",
        "Reply",
        "Directive",
        "OneForOneStrategy",
        "AllForOneStrategy",
        "SupervisorStrategy",
        "Terminated",
        "DeadLetter",
        "PoisonPill",
        "ReceiveTimeout",
        "Mailbox",
        "BoundedMailbox",
        "OverflowPolicy",
        "RoundRobinPool",
        "BroadcastPool",
        "AskTimeoutError",
        "ActorStoppedError",
        "MailboxFullError",
        "run",
    ]
    for name in names:
        assert name in atomr.__all__ and hasattr(atomr, name), name
    assert atomr.__version__ == "0.1.0"


class Quitter(Actor):
    """On "quit", terminates its own system from inside its handler."""

    def __init__(self, log: list[str], entered: asyncio.Event) -> None:
        super().__init__()
        self.log = log
        self.entered = entered

    async def receive(self, message: Any) -> Any:
        if message == "spawn":
            return self.context.spawn(Props(Quitter, self.log, self.entered), name="kid")
        self.entered.set()
        await self.context.system.terminate()

    def post_stop(self) -> None:
        self.log.append(self.context.self_ref.name)


async def test_terminate_awaited_inside_top_level_actor() -> None:
    log: list[str] = []
    entered = asyncio.Event()
    system = ActorSystem("t")
    system.spawn(Props(Quitter, log, entered), name="top").tell("quit")
    await asyncio.wait_for(entered.wait(), 5.0)
    await asyncio.wait_for(system.terminate(), 5.0)  # was: deadlock
    assert log == ["top"] and system.actors == []


async def test_terminate_awaited_inside_child_stops_everything() -> None:
    log: list[str] = []
    entered = asyncio.Event()
    system = ActorSystem("t")
    top = system.spawn(Props(Quitter, log, entered), name="top")
    kid = await top.ask("spawn")
    kid.tell("quit")
    await asyncio.wait_for(entered.wait(), 5.0)
    await asyncio.wait_for(system.terminate(), 5.0)  # was: returned before "top" had stopped
    assert log == ["kid", "top"] and system.actors == []


async def test_cancelled_terminate_does_not_mark_system_terminated() -> None:
    log: list[str] = []
    system = ActorSystem("t")
    system.spawn(Props(Node, log, 2), name="root")
    caller = asyncio.create_task(system.terminate())
    await asyncio.sleep(0)
    caller.cancel()
    await asyncio.gather(caller, return_exceptions=True)
    await asyncio.wait_for(system.terminate(), 5.0)  # still waits for every actor to stop
    assert len(log) == 7 and system.actors == []


class HalfBuilt(Actor):
    """Spawns a child (which spawns one too), then fails in ``__init__``."""

    def __init__(self, kids: list[ActorRef]) -> None:
        super().__init__()
        kids.append(self.context.spawn(Props(Node, [], 1, 1), name="kid"))
        raise ValueError("bad config")

    def receive(self, message: Any) -> Any:
        return message


async def test_failed_spawn_leaves_no_orphan_children() -> None:
    kids: list[ActorRef] = []
    system = ActorSystem("t")
    with pytest.raises(ValueError, match="bad config"):
        system.spawn(Props(HalfBuilt, kids))
    kid = kids[0]
    assert not kid.is_alive
    kid.tell("hello")  # a dead letter, not a message to a forgotten actor
    assert system.dead_letters.count == 1
    await asyncio.wait_for(system.terminate(), 5.0)
    pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert pending == []  # was: the child (and its own child) kept running


class StopsInOrder(Actor):
    """Its post_stop asks ``before`` (an actor started earlier) and logs its name."""

    def __init__(self, log: list[str], before: ActorRef | None) -> None:
        super().__init__()
        self.log = log
        self.before = before

    async def post_stop(self) -> None:
        if self.before is not None:
            await self.before.ask("still there?", timeout=2)  # must still be alive
        self.log.append(self.context.self_ref.name)

    def receive(self, message: Any) -> Any:
        return message


async def test_terminate_stops_top_level_actors_in_reverse_start_order() -> None:
    log: list[str] = []
    system = ActorSystem("t")
    before = None
    for i in range(4):
        before = system.spawn(Props(StopsInOrder, log, before), name=f"a{i}")
    await system.terminate(timeout=10)
    assert log == ["a3", "a2", "a1", "a0"]


class Stuck(Actor):
    """``post_stop`` never returns, or the handler swallows cancellation until
    ``release`` is set (so the test can end its task afterwards)."""

    def __init__(self, how: str, entered: asyncio.Event, release: asyncio.Event) -> None:
        super().__init__()
        self.how = how
        self.entered = entered
        self.release = release

    async def receive(self, message: Any) -> Any:
        if self.how == "swallow":
            self.entered.set()
            while not self.release.is_set():
                with contextlib.suppress(asyncio.CancelledError):  # the bug under test
                    await self.release.wait()
        return message

    async def post_stop(self) -> None:
        if self.how == "post_stop":
            self.entered.set()
            await asyncio.Event().wait()


@pytest.mark.parametrize("how", ["post_stop", "swallow"])
async def test_terminate_has_a_deadline(how: str, caplog: pytest.LogCaptureFixture) -> None:
    entered, release = asyncio.Event(), asyncio.Event()
    system = ActorSystem("t")
    fine = system.spawn(Props(Echo), name="fine")
    stuck = system.spawn(Props(Stuck, how, entered, release), name="stuck")
    stopped = stuck.stop() if how == "post_stop" else None
    watching = ActorSystem("watcher")
    watcher = TestProbe(watching)
    watcher.watch(stuck)
    handled = asyncio.ensure_future(stuck.ask("go", timeout=None))
    await asyncio.wait_for(entered.wait(), 5)
    try:
        with pytest.raises(TimeoutError, match=r"stuck \(Stuck\)") as caught:
            await asyncio.wait_for(system.terminate(timeout=0.2), 10)
        assert "still stopping: atomr://t/user/stuck (Stuck)" in str(caught.value)
        # the last started stops first: `fine` was still waiting its turn
        assert "post_stop did not run): atomr://t/user/fine (Echo)" in str(caught.value)
        assert "abandoned" in caplog.text
        assert "AttributeError" not in caplog.text  # the abandoned `fine` ran none of its code
        assert not fine.is_alive and system.actors == []
        with pytest.raises(ActorStoppedError):
            await stuck.ask("anyone?")
        if stopped is not None:
            await asyncio.wait_for(stopped, 5)  # a wait on the stuck actor ends too
        with pytest.raises(ActorStoppedError):  # the ask it was answering, no deadline of its own
            await asyncio.wait_for(handled, 5)
        await watcher.expect_terminated(stuck, timeout=5)  # its watchers hear of it
    finally:
        release.set()
        await watching.terminate(timeout=5)


async def test_a_terminate_past_its_deadline_leaves_no_task_pending() -> None:
    # a caller that closes its loop once terminate raised (run_until_complete)
    # got "Task was destroyed but it is pending!" for the shutdown task
    entered, release = asyncio.Event(), asyncio.Event()
    system = ActorSystem("t")
    system.spawn(Props(Stuck, "post_stop", entered, release)).stop()
    await asyncio.wait_for(entered.wait(), 5)
    with pytest.raises(TimeoutError, match="abandoned"):
        await system.terminate(timeout=0.05)
    assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []


async def test_async_with_exit_has_a_deadline() -> None:
    entered, release = asyncio.Event(), asyncio.Event()

    async def body() -> None:
        async with ActorSystem("t", terminate_timeout=0.2) as system:
            system.spawn(Props(Stuck, "swallow", entered, release)).tell("go")
            await entered.wait()

    try:
        with pytest.raises(
            TimeoutError, match=r"not stopped after 0.2 s.*still stopping: .*\(Stuck\)"
        ):
            await asyncio.wait_for(body(), 10)
    finally:
        release.set()


async def test_errors_and_refs_name_the_actor_path_and_class(actor_system: ActorSystem) -> None:
    class Broken(Actor):
        def __init__(self) -> None:
            raise ValueError("bad config")

    with pytest.raises(ValueError, match="bad config") as caught:
        actor_system.spawn(Props(Broken), name="broken")
    assert "atomr://test/user/broken (Broken)" in "".join(caught.value.__notes__)
    ref = actor_system.spawn(Props(Echo), name="echo")
    assert repr(ref) == str(ref) == "<ActorRef atomr://test/user/echo (Echo)>"
    await ref.stop()
    with pytest.raises(ActorStoppedError, match=r"atomr://test/user/echo \(Echo\)"):
        await ref.ask("late")


class _ReportsItself(Actor):
    def receive(self, message: Any) -> Any:
        return weakref.ref(self)


@pytest.mark.parametrize("ending", ["stop", "poison", "terminate"])
async def test_a_stopped_actor_is_freed_by_reference_counting_alone(ending: str) -> None:
    # The cyclic collector's passes over 100 k live actors cost whatever runs
    # next, so a dead actor must not be left in reference cycles.
    system = ActorSystem("freed")
    gc.collect()
    gc.disable()
    try:
        ref = system.spawn(Props(_ReportsItself))
        instance = await ref.ask("who")
        ref_alive = weakref.ref(ref)
        if ending == "stop":
            await ref.stop()
        elif ending == "poison":
            ref.tell(PoisonPill())
            await await_condition(lambda: instance() is None, message="the instance was freed")
        else:
            await system.terminate()
        del ref
        for _ in range(3):
            await asyncio.sleep(0)
        assert instance() is None
        assert ref_alive() is None
    finally:
        gc.enable()
        await system.terminate()


async def test_a_dead_actors_ref_still_names_it_in_dead_letters(actor_system: ActorSystem) -> None:
    ref = actor_system.spawn(Props(_ReportsItself))
    await ref.stop()
    seen: list[Any] = []
    actor_system.dead_letters.subscribe(seen.append)
    ref.tell("late")
    assert seen and seen[-1].recipient is ref and seen[-1].message == "late"


class TerminatesFrom(Actor):
    """Awaits its system's terminate from its handler, async pre_start or post_stop."""

    def __init__(self, hook: str, post_stopped: asyncio.Event) -> None:
        super().__init__()
        self.hook = hook
        self.post_stopped = post_stopped

    async def pre_start(self) -> None:
        if self.hook == "pre_start":
            await self.context.system.terminate(timeout=10)

    async def receive(self, message: Any) -> Any:
        if self.hook == "receive":
            await self.context.system.terminate(timeout=10)
        return message

    async def post_stop(self) -> None:
        if self.hook == "post_stop":
            await self.context.system.terminate(timeout=10)
        self.post_stopped.set()


@pytest.mark.parametrize("hook", ["receive", "pre_start", "post_stop"])
async def test_an_actor_may_await_terminate_from_its_handler_or_hooks(hook: str) -> None:
    # Each waited for itself until terminate's deadline, abandoning the others.
    system = ActorSystem("t")
    first_stopped, x_stopped = asyncio.Event(), asyncio.Event()
    system.spawn(Props(TerminatesFrom, "none", first_stopped), name="first")
    x = system.spawn(Props(TerminatesFrom, hook, x_stopped), name="x")
    if hook == "receive":
        with pytest.raises(ActorStoppedError):
            await x.ask("go", timeout=5)
    elif hook == "post_stop":
        await x.ask("go", timeout=5)
        x.tell(PoisonPill())
    await asyncio.wait_for(system.terminate(timeout=2), 5)  # was: TimeoutError after 2 s
    assert first_stopped.is_set()  # every other post_stop ran
    assert x_stopped.is_set() == (hook != "pre_start")  # one that never started does not stop


class Chain(Actor):
    """A chain `depth` deep whose leaf never finishes its post_stop."""

    def __init__(self, depth: int, leaf: asyncio.Future[ActorRef]) -> None:
        super().__init__()
        self.depth = depth
        self.leaf = leaf

    def pre_start(self) -> None:
        if self.depth:
            self.context.spawn(Props(Chain, self.depth - 1, self.leaf), name="n")
        else:
            self.leaf.set_result(self.context.self_ref)

    async def post_stop(self) -> None:
        if not self.depth:
            await asyncio.Event().wait()

    def receive(self, message: Any) -> Any:
        return message


async def test_terminate_abandons_a_tree_deeper_than_the_stack() -> None:
    system = ActorSystem("t")
    leaf: asyncio.Future[ActorRef] = asyncio.get_running_loop().create_future()
    root = system.spawn(Props(Chain, 3 * sys.getrecursionlimit(), leaf), name="root")
    leaf_ref = await asyncio.wait_for(leaf, 30)
    with pytest.raises(TimeoutError, match="still stopping: atomr://t/user/root"):
        await asyncio.wait_for(system.terminate(timeout=0.5), 30)  # was: RecursionError
    assert not root.is_alive and not leaf_ref.is_alive
    with pytest.raises(ActorStoppedError):
        await leaf_ref.ask("anyone?", timeout=5)


class SpawnsInInit(Actor):
    """Spawns a child in its constructor; the one at depth 0 fails there."""

    def __init__(self, depth: int) -> None:
        super().__init__()
        if not depth:
            raise ValueError("the innermost failed")
        self.context.spawn(Props(SpawnsInInit, depth - 1), name="n")


async def test_a_failure_in_nested_constructors_names_the_innermost_actor_once(
    actor_system: ActorSystem,
) -> None:
    with pytest.raises(ValueError, match="innermost") as caught:
        actor_system.spawn(Props(SpawnsInInit, 50), name="root")
    # was one note per level: 50 levels, 50 notes
    assert caught.value.__notes__ == [
        "raised while creating atomr://test/user/root" + "/n" * 50 + " (SpawnsInInit)"
    ]
    assert actor_system.actors == []
