"""Reaching an actor from another thread: work is handed to its loop with
``call_soon_threadsafe``. ``ActorRef`` uses these; the rest of the runtime
runs on the actor's loop only."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .envelope import Envelope
from .errors import ActorStoppedError, MailboxFullError
from .stopping import fail_late

if TYPE_CHECKING:
    from .cell import ActorCell

__all__ = [
    "call_threadsafe",
    "closed_loop",
    "deliver_from_thread",
    "idle_loop_error",
    "wake_from_thread",
]


def closed_loop(cell: ActorCell) -> ActorStoppedError:
    """The actor's loop is closed, so the actor never runs again: it accepts
    nothing more (later messages are dead letters). Returns the error to raise."""
    cell.accepting = False
    return ActorStoppedError(f"{cell.label}: its event loop is closed")


def idle_loop_error(what: str) -> str:
    """The error text for `what` (an actor or a system) used from an event
    loop other than its own, which is open but not running (say, a
    pytest-asyncio fixture and a test of different loop scopes): on the same
    thread that loop cannot run before the running one returns, so an answer
    could never come."""
    return (
        f"{what} runs on another event loop, which is not running now (this thread "
        "is running a different one), so it cannot act or answer here; use it from "
        "the loop it was started on (with pytest-asyncio: give the test the "
        "loop_scope of the fixture that started it)"
    )


def call_threadsafe(cell: ActorCell, callback: Callable[..., object], *args: Any) -> None:
    """Run ``callback(*args)`` on this actor's loop, from any thread.

    Raises:
        ActorStoppedError: if that loop is closed.
    """
    try:
        cell.loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:  # the loop is closed
        raise closed_loop(cell) from None


def wake_from_thread(cell: ActorCell) -> None:
    """Wake the idle actor from another thread (one wake-up for a burst of
    tells). Also called by a tell that queued its message after the actor
    had stopped and emptied its queue (``stopping.fail_pending`` leaves it a
    waiter): the loop then dead-letters what is queued.

    Raises:
        ActorStoppedError: if the actor's loop is closed.
    """
    if not cell.wake_pending:
        cell.wake_pending = True
        call_threadsafe(cell, _woken, cell)


def _woken(cell: ActorCell) -> None:
    cell.wake_pending = False
    if cell.dead:  # told from another thread as it stopped: nothing handles it now
        fail_late(cell)
    else:
        cell.wake()


def deliver_from_thread(cell: ActorCell, env: Envelope) -> None:
    """``tell`` from another thread to a bounded or stopped actor: delivered on
    the loop; a refusal of a full mailbox becomes a dead letter there.

    Raises:
        ActorStoppedError: if the actor's loop is closed.
    """
    call_threadsafe(cell, _deliver_told, cell, env)


def _deliver_told(cell: ActorCell, env: Envelope) -> None:
    try:
        cell.deliver(env)
    except MailboxFullError:
        cell.dead_letter(env[0], env[1], "mailbox full")
