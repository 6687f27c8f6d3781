"""What `TensorBoardLog` (`metrics.py`) needs of tensorboardX's writer: its
writing thread, the events pending in its queue, and waits on them that end.

tensorboardX (2.6) writes the event file from a thread of its own, fed by a
bounded queue. Its `add_scalar` waits for room in that queue, and its
`flush` and `close` for the thread, all without a deadline. The internals
are read with getattr: a version without them skips what needs them.
"""

from __future__ import annotations

import errno
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "POLL_SECONDS",
    "QUEUE",
    "call_while_writing",
    "close_writer",
    "give_up",
    "pending_events",
    "stopped_error",
    "stuck_error",
    "wait_for_room",
    "wait_while_writing",
    "writer_thread",
]

QUEUE = 10_000
"""The events the writer's thread may have pending (`max_queue`). Its
`add_scalar` waits while that many are: with a bound this far above what a
live thread lets pile up, only a dead or stuck thread could make it wait. A
dead one is found before the next write (`stopped_error`), and a write waits
for room only while the thread writes (`wait_for_room`)."""

POLL_SECONDS = 0.05
"""How often a wait looks at the writer's queue (a wait on a thread, so it
ends at once when that thread ends)."""


def _event_writer(writer: Any) -> Any:
    """The `SummaryWriter`'s `EventFileWriter`, or None."""
    return getattr(getattr(writer, "file_writer", None), "event_writer", None)


def writer_thread(writer: Any) -> threading.Thread | None:
    """The thread that writes `writer`'s event file (its `EventFileWriter._worker`)."""
    thread = getattr(_event_writer(writer), "_worker", None)
    return thread if isinstance(thread, threading.Thread) else None


def _queue(writer: Any) -> Any:
    """The queue `writer`'s thread takes its events from, or None."""
    return getattr(_event_writer(writer), "_event_queue", None)


def pending_events(writer: Any) -> int | None:
    """The events in `writer`'s queue, not yet taken by its thread; None
    where that cannot be told (a queue without `qsize`: macOS's)."""
    try:
        return int(_queue(writer).qsize())
    except (AttributeError, NotImplementedError, OSError):
        return None


def stopped_error(writer: Any, logdir: Path) -> OSError | None:
    """The error to raise when the writer's thread stopped, else None:
    tensorboardX's thread dies of the first error writing the event file
    (a full disk) and leaves what comes after in its queue, unwritten."""
    thread = writer_thread(writer)
    if thread is None or thread.is_alive():
        return None
    return OSError(
        errno.EIO,
        "the TensorBoard writer stopped (its error is on stderr); the events since "
        "were not written",
        str(logdir),
    )


def stuck_error(writer: Any, logdir: Path, timeout: float, what: str) -> TimeoutError:
    """The error of a wait on a writer whose thread wrote nothing for
    `timeout` seconds; `what` says what was not done."""
    pending = pending_events(writer)
    queued = f", {pending} events pending" if pending is not None else ""
    return TimeoutError(
        errno.ETIMEDOUT,
        f"the TensorBoard writer is stuck: its thread wrote no event for {timeout:g} s"
        f"{queued}; {what}",
        str(logdir),
    )


def give_up(writer: Any) -> None:
    """After a close that failed: mark the `EventFileWriter` closed, so that
    tensorboardX's exit handler does not try again (failing the same way,
    with a traceback after the run's error, or waiting for ever on a thread
    that is stuck)."""
    event_writer = _event_writer(writer)
    if isinstance(getattr(event_writer, "_closed", None), bool):
        event_writer._closed = True


def wait_while_writing(
    writer: Any, done: Callable[[], bool], waiting_on: threading.Thread, timeout: float
) -> bool:
    """Wait until `done()`, for as long as `writer`'s thread writes: the
    deadline, `timeout` seconds, starts again whenever the thread takes an
    event from its queue. `waiting_on` is joined between looks (the
    writer's thread, or one calling into the writer).

    Returns:
        Whether `done()`; False when the thread took no event for `timeout`
        seconds (it is stuck).
    """
    pending = pending_events(writer)
    deadline = time.monotonic() + timeout
    while not done():
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        waiting_on.join(min(POLL_SECONDS, left))
        now = pending_events(writer)
        if now != pending:
            pending, deadline = now, time.monotonic() + timeout
    return True


def close_writer(writer: Any) -> None:
    """`writer.close()`, then the stop of its thread that the close skips
    when `give_up` marked it closed meanwhile (a close that waited on a stuck
    thread for too long, and went on once the thread did).

    Raises:
        Exception: what `writer.close()` raised.
    """
    thread = writer_thread(writer)
    writer.close()
    stop = getattr(thread, "stop", None)
    if thread is not None and thread.is_alive() and callable(stop):
        stop()


def wait_for_room(writer: Any, events: int, timeout: float) -> bool:
    """Wait, while the writer's thread writes, until `events` more fit in
    its queue (at once when they do, or the thread stopped, or its queue
    cannot be read).

    Returns:
        False when the thread wrote nothing for `timeout` seconds.
    """
    thread = writer_thread(writer)
    bound = getattr(_queue(writer), "_maxsize", None)
    if thread is None or not isinstance(bound, int):
        return True

    def room() -> bool:
        pending = pending_events(writer)
        return pending is None or pending + events <= bound or not thread.is_alive()

    return wait_while_writing(writer, room, thread, timeout)


def call_while_writing(writer: Any, call: Callable[[], object], timeout: float) -> bool:
    """`call()` (a `flush` or `close` of `writer`, which wait on its thread)
    in a thread of its own, waited for as `wait_while_writing` does; a call
    still running after that is left to finish in the background.

    Returns:
        Whether the call finished; False when the writer is stuck.

    Raises:
        Exception: what `call()` raised.
    """
    raised: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:
            raised.append(exc)

    caller = threading.Thread(target=run, name="atomr-tensorboard-writer-call", daemon=True)
    caller.start()
    if not wait_while_writing(writer, lambda: not caller.is_alive(), caller, timeout):
        return False
    if raised:
        raise raised[0]
    return True
