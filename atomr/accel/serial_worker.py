"""``SerialWorker``: one thread that runs jobs in order for an event loop.

A device actor's kernels, a host collective's reductions and a replica group's
host math each run on one thread of their own, one job at a time, while the
event loop goes on. ``loop.run_in_executor`` on a one-thread
``ThreadPoolExecutor`` does that, but costs about 43 us per job even for a
no-op (a work item, a lock and a condition, a ``concurrent.futures.Future`` and
its copy into an asyncio one). A ``SimpleQueue`` and one
``call_soon_threadsafe`` per job cost about 25 us (a no-op job, 5 x 5000 hops
on uvloop, interleaved with the executor), and the hop is paid on every
training step.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import queue
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

from atomr.actor.reply import future_safe

__all__ = ["SerialWorker"]

T = TypeVar("T")

_Job = tuple["asyncio.Future[Any]", asyncio.AbstractEventLoop, Callable[[], Any]]

_IDLE_EXIT_TIMEOUT = 1.0
"""Seconds ``close`` waits for an idle thread to end (it ends at once)."""


class _Lane:
    """One thread's queue and state; a closed worker's next job starts a new lane.

    ``busy`` is True while the thread starts, runs its initializer or runs a
    job; ``closed`` once ``close`` took the lane (a job the thread picks up
    afterwards is dropped). Both are read and written under ``lock``.
    """

    __slots__ = ("busy", "closed", "jobs", "lock", "thread")

    def __init__(self, name: str, serve: Callable[[_Lane], None]) -> None:
        self.jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.busy = True
        self.closed = False
        self.thread = threading.Thread(target=serve, args=(self,), name=name, daemon=True)


def _resolve(fut: asyncio.Future[Any], result: Any) -> None:
    if not fut.done():
        fut.set_result(result)


def _cancel(fut: asyncio.Future[Any], _: Any) -> None:
    fut.cancel()


def _reject(fut: asyncio.Future[Any], error: BaseException) -> None:
    if not fut.done():
        fut.set_exception(future_safe(error))


class SerialWorker:
    """A daemon thread running submitted jobs one at a time, in order.

    The thread starts with the first job; after ``close`` the next job
    starts a new one.

    Args:
        name: the thread's name.
        initializer: called once on each thread before its first job (say, to
            select a CUDA device); if it raises, every job of that thread fails
            with its error.

    The thread is a daemon: a process that exits while a job runs does not
    wait for it (a second Ctrl-C must end the process at once).
    """

    def __init__(self, name: str, initializer: Callable[[], Any] | None = None) -> None:
        self.name = name
        self._initializer = initializer
        self._lane: _Lane | None = None

    def submit(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        """Queue ``fn()`` and return a future of the running loop for its result.

        Cancelling the future before ``fn`` starts drops the job (it never
        runs); once started, ``fn`` runs on to its end.

        Raises:
            RuntimeError: without a running event loop.
        """
        loop = asyncio.get_running_loop()
        lane = self._lane
        if lane is None:
            lane = self._lane = _Lane(self.name, self._serve)
            lane.thread.start()
        fut: asyncio.Future[T] = loop.create_future()
        lane.jobs.put((fut, loop, fn))
        if lane.closed:  # by another thread since it was read: the job may follow the end
            fut.cancel()
        return fut

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the thread.

        Returns:
            What ``fn`` returned.

        Raises:
            BaseException: what ``fn`` raised.
        """
        return await self.submit(functools.partial(fn, *args) if args else fn)

    def close(self) -> None:
        """Stop the thread: jobs not started are cancelled, the running one
        finishes, then the thread ends. An idle thread has ended when this
        returns (a service checking for leaked threads after shutdown finds
        none); a thread running a job, or still starting, is not waited for."""
        lane, self._lane = self._lane, None
        if lane is None:
            return
        with lane.lock:
            lane.closed = True
            idle = not lane.busy
        here = _running_loop()
        while True:
            try:
                job = lane.jobs.get_nowait()
            except queue.Empty:
                break
            if job is None:
                continue
            fut, loop, _ = job
            if loop is here:
                fut.cancel()
            else:  # closed from another thread (a job's own): cancelled on its loop
                _hand_back(loop, _cancel, fut, None)
        lane.jobs.put(None)
        if idle and lane.thread is not threading.current_thread():
            lane.thread.join(_IDLE_EXIT_TIMEOUT)  # it is taking the None now

    def _serve(self, lane: _Lane) -> None:
        failed: BaseException | None = None
        failed_tb: TracebackType | None = None
        if self._initializer is not None:
            try:
                self._initializer()
            except BaseException as error:
                failed, failed_tb = error, error.__traceback__
        get, lock = lane.jobs.get, lane.lock
        with lock:
            lane.busy = False
        while True:
            job = get()
            if job is None:
                return
            fut, loop, fn = job
            if (
                fut.cancelled()
            ):  # a plain flag read; at worst the job runs and its result is dropped
                continue
            if failed is not None:
                _hand_back(loop, _reject_again, fut, (failed, failed_tb))
                continue
            with lock:
                if lane.closed:  # taken before close() emptied the queue: dropped
                    _hand_back(loop, _cancel, fut, None)
                    continue
                lane.busy = True
            settle: Callable[[asyncio.Future[Any], Any], None] = _resolve
            try:
                outcome = fn()
            except BaseException as error:
                settle, outcome = _reject, error
            with lock:  # idle before the caller learns the result (and may close)
                lane.busy = False
            _hand_back(loop, settle, fut, outcome)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running on this thread, or None."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _reject_again(
    fut: asyncio.Future[Any], failure: tuple[BaseException, TracebackType | None]
) -> None:
    """Fail ``fut`` with the initializer's error, its traceback reset to the
    initializer's own: each job's caller that raises it adds frames to the one
    shared object, which would otherwise grow with every job."""
    error, tb = failure
    _reject(fut, error.with_traceback(tb))


def _hand_back(
    loop: asyncio.AbstractEventLoop,
    settle: Callable[[asyncio.Future[Any], Any], None],
    fut: asyncio.Future[Any],
    value: Any,
) -> None:
    # a closed loop raises RuntimeError: nobody is left to await the result
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(settle, fut, value)
