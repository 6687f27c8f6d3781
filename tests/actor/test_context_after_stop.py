"""Context used by code that outlived its actor: a handler that ``terminate``
gave up waiting for, or ``post_stop``. What it hands back to the actor is a
dead letter; what it would start for the actor is refused."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Callable
from typing import Any

import pytest

from atomr import Actor, ActorRef, ActorStoppedError, ActorSystem, Context, DeadLetter, Props
from atomr.testkit import await_condition

from .actors import Echo

Late = Callable[[Context], Any]


class Outlives(Actor):
    """Its handler of "go" swallows the cancellation of its stop until
    ``release`` is set, so ``terminate`` gives up on it; then it calls
    ``late(context)`` and settles ``done`` with what that returns or raises.
    Every message it handles is added to ``seen``."""

    def __init__(
        self, release: asyncio.Event, late: Late, done: asyncio.Future[Any], seen: list[Any]
    ) -> None:
        super().__init__()
        self.release = release
        self.late = late
        self.done = done
        self.seen = seen

    async def receive(self, message: Any) -> Any:
        self.seen.append(message)
        if message != "go":
            return message
        while not self.release.is_set():
            with contextlib.suppress(asyncio.CancelledError):  # the handler that outlives
                await self.release.wait()
        try:
            self.done.set_result(self.late(self.context))
        except Exception as error:
            self.done.set_exception(error)
        return message


class StuckStop(Actor):
    """``post_stop`` never returns: ``terminate`` gives up on it."""

    def receive(self, message: Any) -> Any:
        return message

    async def post_stop(self) -> None:
        await asyncio.Event().wait()


async def _outlive(
    late: Late, *, asked_to_stop: bool = True, queued: tuple[Any, ...] = ()
) -> tuple[ActorRef, asyncio.Future[Any], list[DeadLetter], list[Any]]:
    """Run ``late`` in a handler of an actor abandoned by ``terminate``.

    ``asked_to_stop``: the actor was stopping when terminate gave up (else a
    later actor held terminate up, and this one was never asked). ``queued``:
    messages told to it behind "go". Returns its ref, the outcome of
    ``late``, the dead letters published after terminate gave up, and the
    messages it handled.
    """
    system = ActorSystem("late")
    release, seen = asyncio.Event(), []
    done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    ref = system.spawn(Props(Outlives, release, late, done, seen), name="outlives")
    if not asked_to_stop:
        system.spawn(Props(StuckStop), name="stuck")  # the last started stops first
    for message in ("go", *queued):
        ref.tell(message)
    await await_condition(lambda: "go" in seen, timeout=5)
    with pytest.raises(TimeoutError, match="abandoned"):
        await system.terminate(timeout=0.1)
    letters: list[DeadLetter] = []
    system.dead_letters.subscribe(letters.append)
    release.set()
    await asyncio.wait((done,), timeout=5)
    assert done.done(), "the late handler did not run"
    return ref, done, letters, seen


def _stash_then_unstash(context: Context) -> int:
    context.stash()
    return context.unstash_all()


@pytest.mark.parametrize("late", [Context.stash, _stash_then_unstash], ids=["stash", "unstash"])
async def test_a_message_stashed_after_the_actor_stopped_is_a_dead_letter(late: Late) -> None:
    ref, done, letters, _ = await _outlive(late)
    await done  # no error: the message is not lost either
    assert [(d.message, d.recipient, d.reason) for d in letters] == [("go", ref, "stopped")]


@pytest.mark.parametrize(
    ("what", "late"),
    [
        ("start timers", lambda context: context.schedule_once(0, "tick")),
        ("start timers", lambda context: context.schedule_repeatedly(0.01, "tick")),
        ("watch", lambda context: context.watch(context.self_ref)),
    ],
    ids=["schedule_once", "schedule_repeatedly", "watch"],
)
async def test_what_would_start_for_a_stopped_actor_is_refused(what: str, late: Late) -> None:
    _, done, letters, _ = await _outlive(late)
    with pytest.raises(ActorStoppedError, match=f"outlives is stopping; cannot {what}"):
        await done
    assert letters == []


async def test_a_task_refused_to_a_stopped_actor_is_closed_unrun() -> None:
    coroutine = asyncio.sleep(0)
    _, done, letters, _ = await _outlive(lambda context: context.create_task(coroutine))
    with pytest.raises(ActorStoppedError, match="outlives is stopping; cannot create tasks"):
        await done
    assert inspect.getcoroutinestate(coroutine) == inspect.CORO_CLOSED  # no "never awaited"
    assert letters == []


async def test_a_stopped_actor_watches_no_live_actor(actor_system: ActorSystem) -> None:
    live = actor_system.spawn(Props(Echo), name="live")
    _, done, _, _ = await _outlive(lambda context: context.watch(live))
    with pytest.raises(ActorStoppedError, match="cannot watch"):
        await done
    await live.stop()
    assert actor_system.dead_letters.count == 0  # no Terminated for the dead watcher


async def test_a_handler_that_outlives_its_actor_returns_to_a_loop_that_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # the actor was never asked to stop: terminate gave up on a later one first
    _, done, _, seen = await _outlive(lambda context: None, asked_to_stop=False, queued=("a", "b"))
    await done
    assert seen == ["go"]  # its queued messages became dead letters, none is handled
    assert "escaped" not in caplog.text  # was: IndexError, popping the emptied queue


class TimerInPostStop(Actor):
    def __init__(self, outcome: asyncio.Future[Any]) -> None:
        super().__init__()
        self.outcome = outcome

    def receive(self, message: Any) -> Any:
        return message

    def post_stop(self) -> None:
        try:
            self.outcome.set_result(self.context.schedule_repeatedly(0.01, "tick"))
        except ActorStoppedError as error:
            self.outcome.set_exception(error)


async def test_post_stop_starts_no_timer(actor_system: ActorSystem) -> None:
    outcome: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    ref = actor_system.spawn(Props(TimerInPostStop, outcome))
    await ref.stop()
    with pytest.raises(ActorStoppedError, match="cannot start timers"):
        await outcome  # was: a timer that ticked dead letters for ever
