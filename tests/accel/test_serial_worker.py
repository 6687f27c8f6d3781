"""SerialWorker: jobs in order on one thread, errors handed back, close."""

from __future__ import annotations

import asyncio
import queue
import threading
import traceback
from types import SimpleNamespace
from typing import Any

import pytest

from atomr.accel import serial_worker
from atomr.accel.serial_worker import SerialWorker


async def test_jobs_run_in_order_on_one_thread_off_the_loop() -> None:
    worker = SerialWorker("test-serial")
    seen: list[tuple[int, int]] = []
    results = await asyncio.gather(
        *(worker.run(lambda k=k: seen.append((k, threading.get_ident())) or k) for k in range(50))
    )
    worker.close()
    assert results == list(range(50))
    assert [k for k, _ in seen] == list(range(50))
    threads = {t for _, t in seen}
    assert len(threads) == 1 and threading.get_ident() not in threads


async def test_an_error_reaches_the_awaiting_caller() -> None:
    worker = SerialWorker("test-serial")

    def fails() -> None:
        raise ValueError("bad input")

    with pytest.raises(ValueError, match="bad input"):
        await worker.run(fails)
    assert await worker.run(lambda: 7) == 7  # the thread survives
    worker.close()


async def test_close_cancels_jobs_not_started_and_a_later_job_starts_a_new_thread() -> None:
    worker = SerialWorker("test-serial")
    release = threading.Event()
    started = threading.Event()

    def blocks() -> str:
        started.set()
        assert release.wait(30)
        return "ran"

    running = worker.submit(blocks)
    queued = worker.submit(lambda: "never")
    assert await asyncio.to_thread(started.wait, 30)
    worker.close()
    release.set()
    assert await running == "ran"  # the running job finishes
    with pytest.raises(asyncio.CancelledError):
        await queued
    assert await worker.run(lambda: "again") == "again"
    worker.close()


async def test_a_failed_initializer_fails_every_job() -> None:
    def no_device() -> None:
        raise RuntimeError("no such device")

    worker = SerialWorker("test-serial", no_device)
    depths = []
    for _ in range(4):
        with pytest.raises(RuntimeError, match="no such device") as got:
            await worker.run(lambda: 1)
        depths.append(len(traceback.extract_tb(got.value.__traceback__)))
    worker.close()
    # the one error was raised again for each job: 3 more frames every time
    assert depths == [depths[0]] * 4


async def test_a_job_raising_stop_iteration_reaches_the_caller_as_runtime_error() -> None:
    """asyncio refuses StopIteration in a future; unconverted, the caller waited forever."""
    worker = SerialWorker("test")
    try:
        with pytest.raises(RuntimeError, match="StopIteration") as got:
            await asyncio.wait_for(worker.run(next, iter([])), 10)
        assert isinstance(got.value.__cause__, StopIteration)
        assert await asyncio.wait_for(worker.run(sum, [1, 2]), 10) == 3
    finally:
        worker.close()


async def test_close_of_an_idle_worker_returns_once_its_thread_has_ended() -> None:
    """A service checking for leaked threads right after `terminate()` found
    the idle worker thread still alive (it ended a moment after `close`)."""
    for _ in range(20):  # the thread outlived close() in about 2 runs of 3
        worker = SerialWorker("test-serial-idle")
        assert await worker.run(threading.current_thread) is not threading.current_thread()
        thread = await worker.run(threading.current_thread)
        worker.close()
        assert not thread.is_alive()


async def test_close_does_not_wait_for_a_running_job() -> None:
    worker = SerialWorker("test-serial-busy")
    release, started = threading.Event(), threading.Event()
    running = worker.submit(lambda: started.set() or release.wait(30))
    assert await asyncio.to_thread(started.wait, 30)
    worker.close()  # returns while the job runs
    assert not running.done()
    release.set()
    assert await running is True


async def test_close_from_a_job_cancels_the_queued_jobs_through_their_loop() -> None:
    """A job that closes its own worker cancels the jobs queued behind it
    through their loop: cancelled from the worker thread, a future's
    callbacks were scheduled with the loop's non-thread-safe `call_soon`
    (an idle loop did not wake for them; debug mode refuses the call)."""
    loop = asyncio.get_running_loop()
    loop.set_debug(True)  # call_soon from another thread raises RuntimeError
    worker = SerialWorker("test-serial-self-close")
    go, release = threading.Event(), threading.Event()

    def closes_its_worker() -> bool:
        assert go.wait(30)
        worker.close()
        return release.wait(30)

    closing = worker.submit(closes_its_worker)
    queued = worker.submit(lambda: "never")
    queued.add_done_callback(lambda _: release.set())  # a callback for cancel() to schedule
    go.set()
    try:
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(queued, 10)
        assert await asyncio.wait_for(closing, 10) is True
    finally:
        release.set()
        loop.set_debug(False)


async def test_a_job_queued_as_another_thread_closes_the_worker_is_cancelled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`submit` read the worker's thread, another thread closed the worker,
    then `submit` queued the job behind the thread's end: it was never run
    nor cancelled, and its caller waited for good."""

    class ClosedBeforePut(queue.SimpleQueue[Any]):
        def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
            if item is not None and item[2] is late:
                closer = threading.Thread(target=worker.close)
                closer.start()
                closer.join(30)
            super().put(item, block, timeout)

    monkeypatch.setattr(
        serial_worker, "queue", SimpleNamespace(SimpleQueue=ClosedBeforePut, Empty=queue.Empty)
    )

    def late() -> str:
        return "ran"

    worker = SerialWorker("test-serial-close-race")
    assert await worker.run(lambda: 1) == 1  # the thread runs, idle
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(worker.submit(late), 10)
