"""The MPI thread: where `MpiCollective` runs the calls that block (a parked
request's `Wait`, large local numpy work), so that the event loop never does."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["LazyMpiThread", "MpiThread", "settle"]


class MpiThread(threading.Thread):
    """The MPI thread of one `MpiCollective`: runs blocking calls (a parked
    request's `Wait`, large local numpy work) one at a time and wakes the
    loop once per call with `call_soon_threadsafe`.

    Args:
        name: the thread's name.

    A daemon thread, so a call stuck in MPI (a dead peer) never keeps the
    interpreter from exiting.
    """

    def __init__(self, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.jobs: queue.SimpleQueue[
            tuple[Callable[[], Any], asyncio.AbstractEventLoop | None, asyncio.Future[None] | None]
            | None
        ] = queue.SimpleQueue()

    def run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            fn, loop, future = job
            error: BaseException | None = None
            try:
                fn()
            except BaseException as exc:  # handed to the awaiting coroutine
                error = exc
            if loop is None or future is None:  # `LazyMpiThread.call`: nobody awaits it
                continue
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting
                loop.call_soon_threadsafe(settle, future, error)


class LazyMpiThread:
    """An `MpiThread` started on first use, and again after `close`.

    Args:
        name: the thread's name.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._thread: MpiThread | None = None

    def run(self, fn: Callable[[], Any]) -> asyncio.Future[None]:
        """Run `fn` on the thread; the future (of the running loop) settles
        when it returns, with its exception if it raised."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._started().jobs.put((fn, loop, future))
        return future

    def call(self, fn: Callable[[], None], timeout: float) -> bool:
        """Run `fn` on the thread, after the calls queued before it, and
        block up to `timeout` seconds for it to return (it goes on past
        that); needs no event loop. Returns whether it returned in time.
        Raises nothing (an exception of `fn`'s is dropped)."""
        done = threading.Event()

        def job() -> None:
            try:
                fn()
            finally:
                done.set()

        self._started().jobs.put((job, None, None))
        return done.wait(timeout)

    def _started(self) -> MpiThread:
        thread = self._thread
        if thread is None:
            thread = self._thread = MpiThread(self._name)
            thread.start()
        return thread

    def close(self) -> None:
        """Stop the thread once its current call is done."""
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.jobs.put(None)


def settle(future: asyncio.Future[None], error: BaseException | None) -> None:
    """Resolve `future` with `error`, or with None, unless it is done already."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(None)
