"""Supervision: each directive, the restart window, escalation, AllForOne, hooks."""

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
    Directive,
    Failure,
    OneForOneStrategy,
    Props,
    SupervisorStrategy,
    Terminated,
)
from atomr.testkit import ChildFailed, ManualClock, TestProbe, expect_log

from .actors import Echo


class Stateful(Actor):
    """Counts messages; raises exceptions it is sent; reports hooks to ``probe``."""

    def __init__(self, probe: ActorRef, tag: str = "") -> None:
        super().__init__()
        self.probe = probe
        self.tag = tag
        self.count = 0

    def pre_start(self) -> None:
        self.probe.tell(("pre_start", self.tag))

    def post_stop(self) -> None:
        self.probe.tell(("post_stop", self.tag))

    def pre_restart(self, error: BaseException, message: Any) -> Any:
        self.probe.tell(("pre_restart", self.tag, type(error).__name__, message))
        return super().pre_restart(error, message)

    def post_restart(self, error: BaseException) -> Any:
        self.probe.tell(("post_restart", self.tag, type(error).__name__))
        return super().post_restart(error)

    def receive(self, message: Any) -> Any:
        if isinstance(message, BaseException):
            raise message
        if message == "spawn":
            return self.context.spawn(Props(Stateful, self.probe, self.tag + ".c"), name="c")
        self.count += 1
        return self.count


def decider(error: BaseException) -> Directive:
    if isinstance(error, ValueError):
        return Directive.RESUME
    if isinstance(error, KeyError):
        return Directive.STOP
    if isinstance(error, LookupError):
        return Directive.ESCALATE
    return Directive.RESTART


class Supervisor(Actor):
    """Spawns children of ``Stateful`` under ``strategy``."""

    def __init__(self, probe: ActorRef, strategy: SupervisorStrategy, tag: str = "s") -> None:
        super().__init__()
        self.probe = probe
        self.strategy = strategy
        self.tag = tag

    def supervisor_strategy(self) -> SupervisorStrategy:
        return self.strategy

    def pre_start(self) -> None:
        self.probe.tell(("pre_start", self.tag))

    def post_stop(self) -> None:
        self.probe.tell(("post_stop", self.tag))

    def receive(self, message: Any) -> Any:
        if isinstance(message, BaseException):
            raise message
        kind, name, *strategy = message
        if kind == "spawn":
            return self.context.spawn(Props(Stateful, self.probe, name), name=name)
        if kind == "spawn_supervisor":  # ("spawn_supervisor", name, its strategy)
            return self.context.spawn(Props(Supervisor, self.probe, strategy[0], name), name=name)
        return None


async def start(system: ActorSystem, strategy: SupervisorStrategy, *names: str):
    probe = TestProbe(system)
    sup = system.spawn(Props(Supervisor, probe.ref, strategy))
    await probe.expect_msg(("pre_start", "s"))
    children = [await sup.ask(("spawn", n)) for n in names]
    for n in names:
        await probe.expect_msg(("pre_start", n))
    return probe, sup, children


async def test_resume_keeps_state_and_drops_message(actor_system: ActorSystem) -> None:
    probe, _, (child,) = await start(actor_system, OneForOneStrategy(decider=decider), "a")
    assert await child.ask("x") == 1
    with pytest.raises(ValueError):
        await child.ask(ValueError("resume me"))
    assert await child.ask("x") == 2  # same instance: state kept
    await probe.expect_no_msg(0.02)  # no hooks ran


async def test_restart_new_instance_and_hooks(actor_system: ActorSystem) -> None:
    probe, _, (child,) = await start(actor_system, OneForOneStrategy(decider=decider), "a")
    assert await child.ask("x") == 1
    error = RuntimeError("restart me")
    with pytest.raises(RuntimeError):
        await child.ask(error)
    assert await probe.receive_n(4) == [
        ("pre_restart", "a", "RuntimeError", error),
        ("post_stop", "a"),  # default pre_restart calls post_stop
        ("post_restart", "a", "RuntimeError"),
        ("pre_start", "a"),  # default post_restart calls pre_start
    ]
    assert await child.ask("x") == 1  # fresh state from Props


async def test_restart_keeps_mailbox_and_stops_children(actor_system: ActorSystem) -> None:
    probe, _, (child,) = await start(actor_system, OneForOneStrategy(), "a")
    grandchild = await child.ask("spawn")
    await probe.expect_msg(("pre_start", "a.c"))
    child.tell(RuntimeError("x"))
    child.tell("queued")
    assert await child.ask("after") == 2  # "queued" survived the restart
    assert not grandchild.is_alive
    messages = await probe.receive_n(5)
    assert ("post_stop", "a.c") in messages


class WatchesItsChild(Actor):
    """Spawns and watches a child; reports every ``Terminated`` it gets to ``probe``."""

    def __init__(self, probe: ActorRef) -> None:
        super().__init__()
        self.probe = probe
        self.child = self.context.watch(self.context.spawn(Props(Echo)))

    def receive(self, message: Any) -> Any:
        if isinstance(message, Terminated):
            self.probe.tell(("terminated", message.ref == self.child))
        elif isinstance(message, Exception):
            raise message
        return message


async def test_restart_unwatches_the_old_instances_children(actor_system: ActorSystem) -> None:
    """As Akka's default pre_restart: the new instance gets no Terminated for
    the children of the instance it replaced (it never had them)."""
    probe = TestProbe(actor_system)
    parent = actor_system.spawn(Props(WatchesItsChild, probe.ref))
    with pytest.raises(RuntimeError):
        await parent.ask(RuntimeError("restart"))
    # the old child's Terminated, if any, is queued by the time the restart ends
    assert await parent.ask("after") == "after"
    assert await parent.ask("again") == "again"
    await probe.expect_no_msg(0.05)


class StashesThenFails(Actor):
    """Stashes "later" and fails the first time; handles it the next time."""

    handlings = 0

    def receive(self, message: Any) -> Any:
        StashesThenFails.handlings += 1
        if StashesThenFails.handlings == 1:
            self.context.stash()
            raise RuntimeError("fails after stashing")
        return ("handled", message)


async def test_a_message_stashed_before_a_failure_is_handled_by_the_new_instance(
    actor_system: ActorSystem,
) -> None:
    """The stash survives a restart (as in Akka; docs/reliability.md): the
    stashed ask is answered by the new instance, not failed."""
    StashesThenFails.handlings = 0
    ref = actor_system.spawn(Props(StashesThenFails))
    assert await ref.ask("later", timeout=5.0) == ("handled", "later")
    assert StashesThenFails.handlings == 2


async def test_stop_directive(actor_system: ActorSystem) -> None:
    probe, _, (child,) = await start(actor_system, OneForOneStrategy(decider=decider), "a")
    probe.watch(child)
    with pytest.raises(KeyError):
        await child.ask(KeyError("stop me"))
    await probe.expect_msg(("post_stop", "a"))
    await probe.expect_terminated(child)
    assert not child.is_alive


async def test_restart_window_then_stop(actor_system: ActorSystem) -> None:
    strategy = OneForOneStrategy(max_restarts=2, within=10.0)
    probe, _, (child,) = await start(actor_system, strategy, "a")
    probe.watch(child)
    for _ in range(2):
        with pytest.raises(RuntimeError):
            await child.ask(RuntimeError("again"))
        assert await child.ask("alive") == 1
    await probe.receive_n(8)  # two restarts, four hooks each
    with pytest.raises(RuntimeError):
        await child.ask(RuntimeError("third"))
    await probe.expect_msg(("post_stop", "a"))
    await probe.expect_terminated(child)


async def test_restart_window_slides() -> None:
    clock = ManualClock()  # the restart window runs on the system's scheduler
    system = ActorSystem("window", scheduler=clock)
    strategy = OneForOneStrategy(max_restarts=1, within=0.05)
    probe, _, (child,) = await start(system, strategy, "a")
    for _ in range(3):
        with pytest.raises(RuntimeError):
            await child.ask(RuntimeError("spaced"))
        clock.advance(0.08)  # the earlier restart falls out of the window
        assert await child.ask("alive") == 1
    assert child.is_alive
    await system.terminate(timeout=10)


async def test_all_for_one_restarts_siblings(actor_system: ActorSystem) -> None:
    probe, _, (a, b, c) = await start(actor_system, AllForOneStrategy(), "a", "b", "c")
    for ref in (a, b, c):
        assert await ref.ask("x") == 1
    with pytest.raises(RuntimeError):
        await b.ask(RuntimeError("one fails"))
    for ref in (a, b, c):
        assert await ref.ask("x") == 1  # every sibling got a fresh instance
    events = await probe.receive_n(12)
    restarted = {e[1] for e in events if e[0] == "post_restart"}
    assert restarted == {"a", "b", "c"}


async def test_all_for_one_counts_a_restart_for_every_child(actor_system: ActorSystem) -> None:
    # As in Akka, an AllForOne restart restarts, and so counts against the
    # limit of, every child: a sibling failing next exceeds max_restarts=1
    # (each child counted only its own failures: N children, N times the limit)
    strategy = AllForOneStrategy(max_restarts=1, within=60.0)
    probe, _, (a, b) = await start(actor_system, strategy, "a", "b")
    with pytest.raises(RuntimeError):
        await a.ask(RuntimeError("a fails"))
    assert await b.ask("x") == 1  # b was restarted too
    probe.watch(a)
    probe.watch(b)
    with pytest.raises(RuntimeError):
        await b.ask(RuntimeError("b fails"))
    stopped = set()
    for _ in range(2):  # past the hooks' reports
        stopped.add((await probe.fish_for_message(lambda m: isinstance(m, Terminated))).ref)
    assert stopped == {a, b}


async def test_all_for_one_stop_stops_siblings(actor_system: ActorSystem) -> None:
    strategy = AllForOneStrategy(decider=decider)
    probe, _, (a, b) = await start(actor_system, strategy, "a", "b")
    with pytest.raises(KeyError):
        await a.ask(KeyError("stop all"))
    assert sorted(await probe.receive_n(2)) == [("post_stop", "a"), ("post_stop", "b")]
    assert not a.is_alive and not b.is_alive


async def test_escalation_up_two_levels(actor_system: ActorSystem) -> None:
    # top (restart on everything) > mid (escalate) > low (escalate) > leaf fails
    escalate = OneForOneStrategy(decider=lambda e: Directive.ESCALATE)
    probe = TestProbe(actor_system)
    top = actor_system.spawn(Props(Supervisor, probe.ref, OneForOneStrategy(), "top"))
    await probe.expect_msg(("pre_start", "top"))
    mid = await top.ask(("spawn_supervisor", "mid", escalate))
    await probe.expect_msg(("pre_start", "mid"))
    low = await mid.ask(("spawn_supervisor", "low", escalate))
    await probe.expect_msg(("pre_start", "low"))
    leaf = await low.ask(("spawn", "leaf"))
    await probe.expect_msg(("pre_start", "leaf"))
    assert await leaf.ask("x") == 1

    with pytest.raises(LookupError):
        await leaf.ask(LookupError("escalate me"))
    # mid is restarted by top: its subtree (low, leaf) is stopped, leaves first
    events = await probe.receive_n(3)
    assert events == [("post_stop", "leaf"), ("post_stop", "low"), ("post_stop", "mid")]
    await probe.expect_msg(("pre_start", "mid"))  # mid's new instance
    assert mid.is_alive and top.is_alive
    assert not low.is_alive and not leaf.is_alive


async def test_escalation_to_guardian_stops_top_level() -> None:
    escalate = OneForOneStrategy(decider=lambda e: Directive.ESCALATE)
    async with ActorSystem("esc", guardian_strategy=escalate) as system:
        probe = TestProbe(system)
        top = system.spawn(Props(Supervisor, probe.ref, escalate, "top"))
        await probe.expect_msg(("pre_start", "top"))
        child = await top.ask(("spawn", "c"))
        await probe.expect_msg(("pre_start", "c"))
        child.tell(RuntimeError("up"))
        assert await probe.receive_n(2) == [("post_stop", "c"), ("post_stop", "top")]
        assert not top.is_alive


async def test_escalated_child_resumed_with_parent(actor_system: ActorSystem) -> None:
    probe = TestProbe(actor_system)
    top = actor_system.spawn(
        Props(Supervisor, probe.ref, OneForOneStrategy(decider=lambda e: Directive.RESUME), "top")
    )
    await probe.expect_msg(("pre_start", "top"))
    escalate = OneForOneStrategy(decider=lambda e: Directive.ESCALATE)
    mid = await top.ask(("spawn_supervisor", "mid", escalate))
    await probe.expect_msg(("pre_start", "mid"))
    leaf = await mid.ask(("spawn", "leaf"))
    await probe.expect_msg(("pre_start", "leaf"))
    assert await leaf.ask("x") == 1
    with pytest.raises(RuntimeError):
        await leaf.ask(RuntimeError("escalate, then resume"))
    assert await leaf.ask("x") == 2  # resumed with its state once mid resumed
    await probe.expect_no_msg(0.02)


async def test_guardian_restarts_top_level_by_default(actor_system: ActorSystem) -> None:
    probe = TestProbe(actor_system)
    ref = actor_system.spawn(Props(Stateful, probe.ref, "t"))
    await probe.expect_msg(("pre_start", "t"))
    assert await ref.ask("x") == 1
    with pytest.raises(RuntimeError):
        await ref.ask(RuntimeError())
    assert await ref.ask("x") == 1


async def test_props_strategy_overrides_method(actor_system: ActorSystem) -> None:
    probe = TestProbe(actor_system)
    props = Props(Supervisor, probe.ref, OneForOneStrategy(), "s").with_supervisor_strategy(
        OneForOneStrategy(decider=lambda e: Directive.RESUME)
    )
    sup = actor_system.spawn(props)
    child = await sup.ask(("spawn", "a"))
    assert await child.ask("x") == 1
    with pytest.raises(RuntimeError):
        await child.ask(RuntimeError())
    assert await child.ask("x") == 2


class FailingStart(Actor):
    def pre_start(self) -> None:
        raise RuntimeError("cannot start")

    def receive(self, message: Any) -> Any:
        return message


async def test_failing_pre_start_stops_actor(actor_system: ActorSystem) -> None:
    ref = actor_system.spawn(Props(FailingStart))
    await asyncio.wait_for(ref.stop(), 1)
    assert not ref.is_alive


def test_strategy_validation() -> None:
    with pytest.raises(ValueError, match="max_restarts"):
        OneForOneStrategy(max_restarts=-1)
    for wrong in (True, 1.0, "1"):
        with pytest.raises(TypeError, match="max_restarts must be an int"):
            OneForOneStrategy(max_restarts=wrong)  # type: ignore[arg-type]
    strategy = OneForOneStrategy(max_restarts=np.int64(2), within=np.float32(10))
    assert (strategy.max_restarts, strategy.within) == (2, 10.0)  # NumPy's numbers are numbers
    assert type(strategy.max_restarts) is int and type(strategy.within) is float
    with pytest.raises(ValueError, match="within"):
        OneForOneStrategy(max_restarts=1, within=-2.0)
    with pytest.raises(TypeError, match="decider"):
        OneForOneStrategy(decider="restart")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Directive"):
        OneForOneStrategy(decider=lambda e: "restart").decide(RuntimeError())  # type: ignore[arg-type,return-value]


class Once(Actor):
    """Its factory works once; later calls (restarts) raise."""

    def __init__(self, log: list[str]) -> None:
        super().__init__()
        if log:
            raise ValueError("cannot rebuild")
        log.append("built")
        self.log = log

    def receive(self, message: Any) -> Any:
        raise RuntimeError("fail")

    def post_stop(self) -> None:
        self.log.append("post_stop")


async def test_post_stop_runs_once_when_restart_cannot_rebuild(actor_system: ActorSystem) -> None:
    log: list[str] = []
    ref = actor_system.spawn(Props(Once, log))
    with pytest.raises(RuntimeError):
        await ref.ask("x")
    await ref.stop()
    assert log == ["built", "post_stop"]  # was: post_stop twice on the same instance


class StopsThenFails(Actor):
    def receive(self, message: Any) -> Any:
        self.context.stop(self.context.self_ref)
        raise RuntimeError("failed while stopping")


async def test_handler_error_while_stopping_is_logged(
    actor_system: ActorSystem, caplog: pytest.LogCaptureFixture
) -> None:
    probe = TestProbe(actor_system)
    ref = probe.watch(actor_system.spawn(Props(StopsThenFails)))
    ref.tell("go")
    await probe.expect_terminated(ref)
    assert any("failed while stopping" in r.getMessage() for r in caplog.records)  # was: silent


class ReportsSender(Actor):
    """Raises what it is sent; its hooks tell the failed message's sender."""

    def receive(self, message: Any) -> Any:
        raise message

    def pre_restart(self, error: BaseException, message: Any) -> None:
        sender = self.context.sender
        assert sender is not None, "no sender in pre_restart"
        sender.tell(("pre_restart", message))

    def post_stop(self) -> None:
        sender = self.context.sender
        if sender is not None:
            sender.tell("post_stop")


async def test_sender_of_the_failed_message_in_pre_restart(actor_system: ActorSystem) -> None:
    probe = TestProbe(actor_system)
    ref = actor_system.spawn(Props(ReportsSender))
    error = RuntimeError("restart")
    ref.tell(error, sender=probe.ref)
    assert await probe.expect_msg(("pre_restart", error)) == ("pre_restart", error)


async def test_sender_of_the_failed_message_in_post_stop(actor_system: ActorSystem) -> None:
    probe = TestProbe(actor_system, supervisor_strategy=OneForOneStrategy(decider=stop_all))
    child = probe.spawn_child(Props(ReportsSender))
    child.tell(KeyError("stop"), sender=probe.ref)
    failed = await probe.expect_msg_type(ChildFailed)
    assert failed.child is child and failed.directive is Directive.STOP
    await probe.expect_msg("post_stop")


async def test_no_sender_in_post_stop_of_a_plain_stop(actor_system: ActorSystem) -> None:
    probe = TestProbe(actor_system)
    ref = probe.watch(actor_system.spawn(Props(ReportsSender)))
    ref.tell("hello?", sender=probe.ref)  # raises: the guardian restarts it
    await probe.expect_msg(("pre_restart", "hello?"))
    await ref.stop()
    await probe.expect_terminated(ref)  # and no "post_stop": no sender then


def stop_all(error: BaseException) -> Directive:
    return Directive.STOP


class _Leaf(Actor):
    def receive(self, message: Any) -> Any:
        raise ValueError("leaf failed")


class _BadStrategyParent(Actor):
    def __init__(self, mistake: str) -> None:
        super().__init__()
        self.mistake = mistake

    def supervisor_strategy(self) -> Any:
        if self.mistake == "raises":
            raise RuntimeError("strategy bug")
        return None

    def receive(self, message: Any) -> Any:
        return self.context.spawn(Props(_Leaf))


@pytest.mark.parametrize("mistake", ["raises", "returns None"])
async def test_a_parent_whose_strategy_is_broken_escalates_and_is_named(
    actor_system: ActorSystem, caplog: pytest.LogCaptureFixture, mistake: str
) -> None:
    """As a decider that raises: the parent's own bug, escalated to its
    supervisor (the default restarts it), not blamed on the child."""
    parent = actor_system.spawn(Props(_BadStrategyParent, mistake), name="parent")
    leaf = await parent.ask("spawn")
    with pytest.raises(ValueError, match="leaf failed"):
        await leaf.ask("go")
    probe = TestProbe(actor_system)
    probe.watch(leaf)
    await probe.expect_terminated(leaf)  # the restarted parent's children are stopped
    lines = [r.getMessage() for r in caplog.records]
    assert any(f"supervisor_strategy() of {parent.path}" in line for line in lines), lines
    assert parent.is_alive


class Iterating(Actor):
    """Answers each ask with the next item of a short iterator: `next()` on
    an exhausted one raises StopIteration, which asyncio cannot put into a
    future."""

    def __init__(self) -> None:
        super().__init__()
        self.items = iter([1])

    def receive(self, message: Any) -> Any:
        if message == "failure":
            return Failure(StopIteration("as an answer"))
        if message == "deferred":
            self.context.defer().set_exception(StopAsyncIteration())
            return None
        return next(self.items)


@pytest.mark.parametrize("timeout", [5.0, None])
async def test_a_handler_raising_stop_iteration_answers_and_is_supervised(
    actor_system: ActorSystem, timeout: float | None
) -> None:
    ref = actor_system.spawn(Props(Iterating))
    assert await ref.ask("next", timeout=timeout) == 1
    with pytest.raises(RuntimeError, match="StopIteration raised where an answer was due") as got:
        await asyncio.wait_for(ref.ask("next", timeout=timeout), 10)
    assert isinstance(got.value.__cause__, StopIteration)
    # supervised like any failure: restarted (a fresh iterator), not stopped
    assert await ref.ask("next", timeout=timeout) == 1
    with pytest.raises(RuntimeError, match="StopIteration"):
        await asyncio.wait_for(ref.ask("failure", timeout=timeout), 10)
    with pytest.raises(RuntimeError, match="StopAsyncIteration"):
        await asyncio.wait_for(ref.ask("deferred", timeout=timeout), 10)
    assert ref.is_alive


class SlowRestart(Actor):
    """Its async ``pre_start`` never returns once it has failed (a slow
    device init, run again by the default ``post_restart``)."""

    def __init__(self, probe: ActorRef, failed: asyncio.Event) -> None:
        super().__init__()
        self.probe = probe
        self.failed = failed

    async def pre_start(self) -> None:
        self.probe.tell("pre_start")
        if self.failed.is_set():
            await asyncio.Event().wait()  # hangs until a stop cancels it

    def post_stop(self) -> None:
        self.probe.tell("post_stop")

    def receive(self, message: Any) -> Any:
        self.failed.set()
        raise RuntimeError("boom")


async def test_a_stop_cancels_an_async_post_restart_as_it_cancels_pre_start(
    actor_system: ActorSystem,
) -> None:
    """The new instance's async ``post_restart`` is cancelled by a stop, as
    the first ``pre_start`` is (it used to hold the stop, and ``terminate``,
    until it returned: forever here); the instance never started, so no
    ``post_stop``."""
    probe = TestProbe(actor_system)
    ref = actor_system.spawn(Props(SlowRestart, probe.ref, asyncio.Event()))
    await probe.expect_msg("pre_start")
    ref.tell("fail")
    await probe.expect_msg("post_stop")  # the default pre_restart
    await probe.expect_msg("pre_start")  # the new instance's, hanging
    await asyncio.wait_for(ref.stop(), 5)
    await probe.expect_no_msg()


class SlowToStop(Actor):
    """Its async ``post_stop`` tells ``probe`` "stopping", then waits for
    ``release``."""

    def __init__(self, probe: ActorRef, release: asyncio.Event) -> None:
        super().__init__()
        self.probe = probe
        self.release = release

    async def post_stop(self) -> None:
        self.probe.tell("stopping")
        await self.release.wait()


class ParentOfSlowToStop(Actor):
    """Spawns a `SlowToStop` child in ``pre_start`` (each instance anew), and
    fails on every message."""

    def __init__(self, probe: ActorRef, release: asyncio.Event) -> None:
        super().__init__()
        self.probe = probe
        self.release = release

    def pre_start(self) -> None:
        self.probe.tell("pre_start")
        self.context.spawn(Props(SlowToStop, self.probe, self.release), name="slow")

    def post_stop(self) -> None:
        self.probe.tell("post_stop")

    def receive(self, message: Any) -> Any:
        raise RuntimeError("boom")


async def test_a_stop_during_a_restart_starts_no_new_instance(
    actor_system: ActorSystem,
) -> None:
    """A stop that comes while the restart waits for the old children to
    stop ends the actor there: no new instance is built only to be stopped
    (its pre_start used to run, and fail to spawn, logged as a failed
    restart), and post_stop runs once (the default pre_restart's)."""
    probe, release = TestProbe(actor_system), asyncio.Event()
    ref = actor_system.spawn(Props(ParentOfSlowToStop, probe.ref, release))
    await probe.expect_msg("pre_start")
    async with expect_log("restart of .* failed", level="ERROR", count=0):
        ref.tell("fail")
        await probe.expect_msg("stopping")  # the restart waits for the old child
        stopping = asyncio.ensure_future(ref.stop())
        release.set()
        await asyncio.wait_for(stopping, 5)
    await probe.expect_msg("post_stop")
    await probe.expect_no_msg()


class CancelledInPreRestart(Actor):
    """Fails on every message; its async pre_restart awaits a task it cancelled."""

    def receive(self, message: Any) -> Any:
        raise RuntimeError("boom")

    async def pre_restart(self, error: BaseException, message: Any) -> None:
        task = asyncio.create_task(asyncio.sleep(3600))
        await asyncio.sleep(0)
        task.cancel()
        await task


async def test_cancelled_error_escaping_pre_restart_is_logged(actor_system: ActorSystem) -> None:
    """As a handler's or post_restart's, a CancelledError that an async
    pre_restart lets escape stops the actor with an error logged (it stopped
    with none: only the failure that caused the restart was logged)."""
    probe = TestProbe(actor_system)
    ref = actor_system.spawn(Props(CancelledInPreRestart))
    probe.watch(ref)
    async with expect_log("pre_restart of .* let CancelledError escape", level="ERROR"):
        ref.tell("fail")
        await probe.expect_terminated(ref)
