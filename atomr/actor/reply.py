"""How an ``ask`` is answered: ``Failure`` and the deferred ``Reply`` handle."""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .cell import ActorCell

__all__ = [
    "Failure",
    "Reply",
    "actor_failed",
    "delivered",
    "drop_ask",
    "drop_deferred",
    "fail_deferred",
    "future_safe",
    "not_handled",
    "share_ask",
]

_FAILED_ACTOR = "__atomr_failed_actor__"


def future_safe(error: BaseException) -> BaseException:
    """`error`, or, for a `StopIteration` / `StopAsyncIteration` (which asyncio
    refuses to put into a future), a `RuntimeError` caused by it, as Python
    turns one that escapes a coroutine (PEP 479)."""
    if isinstance(error, StopIteration | StopAsyncIteration):
        wrapped = RuntimeError(f"{type(error).__name__} raised where an answer was due: {error!r}")
        wrapped.__cause__ = error
        return wrapped
    return error


def delivered(error: BaseException, failed: bool) -> BaseException:
    """`future_safe(error)`, marked for `actor_failed`: `failed` when it
    escaped the handler (the actor failed), not when the actor answered it
    (`Failure`). Only the latest delivery of an exception object counts."""
    error = future_safe(error)
    if failed or getattr(error, _FAILED_ACTOR, False):
        # an exception type that refuses attributes (a frozen one) stays unmarked
        with contextlib.suppress(AttributeError, TypeError):
            setattr(error, _FAILED_ACTOR, failed)
    return error


def actor_failed(error: BaseException) -> bool:
    """Whether an ask was answered with `error` because it escaped the actor's
    `receive`: the actor failed, and its supervisor decided what became of
    it (resumed, restarted with its state lost, or stopped), rather than the
    actor answering `Failure(error)` itself and keeping its state. Read it
    as soon as the ask raised: answering the same exception object again
    (another actor's `Failure(error)`) clears the mark. A deferred reply
    (`Context.defer`) still out when a failure restarts the actor is failed
    with that failure's exception, marked too: the instance that held it is
    gone.

    Args:
        error: what an `ask` raised.

    Returns:
        True for an exception that escaped the asked actor's handler; False
        for its `Failure` answer, and for anything the runtime did not
        deliver (an `AskTimeoutError`, an `ActorStoppedError`).
    """
    return bool(getattr(error, _FAILED_ACTOR, False))


@dataclass(frozen=True, slots=True)
class Failure:
    """Return ``Failure(exc)`` from ``receive`` to answer an ask with ``exc``.

    The asker's ``await ref.ask(...)`` raises ``exc``; the actor itself does
    not fail (no supervision, state kept). Use it for bad input.

    Raises:
        TypeError: if ``exception`` is not an exception instance.
    """

    exception: BaseException

    def __post_init__(self) -> None:
        if not isinstance(self.exception, BaseException):
            raise TypeError(
                f"Failure expects an exception instance, got {type(self.exception).__name__}"
            )


def not_handled(receiver: str, message: Any) -> Failure:
    """The ``Failure(TypeError)`` an actor answers a message it does not
    handle with; a message class sent instead of an instance is named so.

    Args:
        receiver: what the actor is called in the message (its class name).
        message: what it was sent.
    """
    if isinstance(message, type):
        return Failure(
            TypeError(
                f"{receiver} does not handle the class {message.__name__}: "
                f"send an instance, {message.__name__}(...)"
            )
        )
    return Failure(TypeError(f"{receiver} does not handle {type(message).__name__}"))


class Reply:
    """Handle to answer an ask after the handler returned (``context.defer()``).

    A reply to a ``tell`` goes nowhere (both setters return False). If the
    actor stops before answering, the asker gets ``ActorStoppedError`` (an
    ask forwarded to several: once every one of them dropped it). It
    may be answered from any thread (a worker thread's result, as in Akka):
    off the actor's event loop the answer is handed over to that loop.
    """

    __slots__ = ("_cell", "_future")

    def __init__(self, future: asyncio.Future[Any] | None, cell: ActorCell | None) -> None:
        self._future = future
        self._cell = cell
        if future is not None:
            # an ask that ends otherwise (its timeout) frees the reply at once,
            # not when the actor stops, even if the actor keeps this handle
            future.add_done_callback(self._ended)

    def _ended(self, future: asyncio.Future[Any]) -> None:
        self._future = None
        if self._cell is not None:
            if self in self._cell.replies:
                self._cell.replies.discard(self)  # type: ignore[union-attr]
            self._cell = None

    @property
    def done(self) -> bool:
        """True once answered (or when there is no asker to answer)."""
        return self._future is None or self._future.done()

    def set_result(self, value: Any) -> bool:
        """Answer the ask with ``value`` (a ``Failure`` answers with its exception).

        Returns:
            True if an asker was waiting and got the answer (from another
            thread: was waiting when called; the answer follows on its loop).
        """
        if isinstance(value, Failure):
            return self.set_exception(value.exception)
        return self._settle(value, None)

    def set_exception(self, exc: BaseException) -> bool:
        """Answer the ask by raising ``exc`` in the asker (the actor answered
        it: not marked `actor_failed`).

        Returns:
            True if an asker was waiting and got the exception (from another
            thread: as ``set_result``).
        Raises:
            TypeError: if ``exc`` is not an exception instance.
        """
        if not isinstance(exc, BaseException):
            raise TypeError(f"set_exception expects an exception, got {type(exc).__name__}")
        return self._answer(delivered(exc, False))

    def _drop(self, error: BaseException) -> None:
        """The actor holding this reply stopped: `drop_ask` its ask (an
        answer set later goes nowhere, as it would with the ask failed); off
        the asker's loop, handed over to that loop, as `_settle` does."""
        fut = self._future
        if fut is not None and not _on_loop_of(fut):
            with contextlib.suppress(RuntimeError):  # its loop is closed: nobody waits
                fut.get_loop().call_soon_threadsafe(self._drop, error)
            return
        fut = self._release()
        self._future = None
        if fut is not None:
            drop_ask(fut, error)

    def _answer(self, error: BaseException) -> bool:
        """Raise `error` (already `delivered`) in the asker, if one waits."""
        return self._settle(None, error)

    def _settle(self, value: Any, error: BaseException | None) -> bool:
        """Answer with `error`, or else `value`; called off the asker's loop
        (another thread), hand the answer over to that loop."""
        fut = self._future
        if fut is not None and not _on_loop_of(fut):
            if fut.done():
                return False
            try:
                fut.get_loop().call_soon_threadsafe(self._settle, value, error)
            except RuntimeError:  # its loop is closed: nobody waits any more
                return False
            return True
        fut = self._release()
        if fut is None:
            return False
        if error is None:
            fut.set_result(value)
        else:
            fut.set_exception(error)
        return True

    def _release(self) -> asyncio.Future[Any] | None:
        fut = self._future
        if self._cell is not None:
            if self in self._cell.replies:
                self._cell.replies.discard(self)  # type: ignore[union-attr]
            self._cell = None
        if fut is None or fut.done():
            return None
        return fut

    def __repr__(self) -> str:
        return f"Reply(done={self.done})"


def _on_loop_of(future: asyncio.Future[Any]) -> bool:
    """Whether the running code runs on `future`'s event loop."""
    try:
        return asyncio.get_running_loop() is future.get_loop()
    except RuntimeError:  # no running loop: another thread
        return False


def fail_deferred(replies: Iterable[Reply], error: BaseException, failed: bool) -> None:
    """Answer every reply still out with `error`, marked for `actor_failed`
    when `failed` (the actor failed and its instance is gone), as
    `delivered` marks it: the runtime's answer to the deferred replies of an
    instance that restarts or stops."""
    answer = delivered(error, failed)
    for reply in list(replies):
        reply._answer(answer)


def drop_deferred(replies: Iterable[Reply], error: BaseException) -> None:
    """The actor holding `replies` stopped: `drop_ask` the ask of each one
    still out (one that other actors hold too fails only with the last)."""
    for reply in list(replies):
        reply._drop(error)


_HOLDERS: weakref.WeakKeyDictionary[asyncio.Future[Any], int] = weakref.WeakKeyDictionary()
"""How many actors hold each ask that ``forward`` gave to several (one
whose future is not here is held by one): on the loop of the actors that
hold it, as they are local to the one that forwarded it."""


def share_ask(fut: asyncio.Future[Any], more: int) -> None:
    """The holder of the ask `fut` gives it to `more` + 1 actors (``forward``
    to several): `more` more actors hold it (fewer, for a negative `more`:
    the holder takes back an ask that no actor took)."""
    holders = _HOLDERS.get(fut, 1) + more
    if holders > 1:
        _HOLDERS[fut] = holders
    else:
        _HOLDERS.pop(fut, None)


def drop_ask(fut: asyncio.Future[Any], error: BaseException) -> None:
    """An actor drops the ask `fut` unanswered (it stopped, or its full
    mailbox dropped the message): the ask fails with `error` unless another
    actor still holds it (``share_ask``), whose answer it then waits for.
    The runtime's only way to fail an ask that an actor held; an answer
    (the actor's ``Failure``, its handler's exception) fails it at once."""
    if fut.done():
        return
    if _HOLDERS:
        holders = _HOLDERS.pop(fut, 1)
        if holders > 1:
            _HOLDERS[fut] = holders - 1
            return
    fut.set_exception(error)
