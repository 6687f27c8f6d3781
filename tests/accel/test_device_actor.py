"""DeviceActor: ordered work on its own thread, off the event loop; errors; parallel CPU devices."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from atomr.accel import DeviceActor, GpuError, OutOfMemory, backend_for, cuda_available
from atomr.accel.device_actor import OnDevice
from atomr.accel.threads import BLAS_SHARE, blas_threads
from atomr.actor import AskTimeoutError, Props
from atomr.testkit import await_condition


class Worker(DeviceActor):
    """Answers ('order', i) by running a job that records i, and ('blocking', event)."""

    def __init__(self, device: str, log: list) -> None:
        super().__init__(device)
        self.log = log

    async def receive(self, message):
        if isinstance(message, tuple) and message[0] == "gather":
            jobs = [self.on_device(self.log.append, i) for i in range(message[1])]
            await asyncio.gather(*jobs)
            return threading.current_thread().name
        if isinstance(message, tuple) and message[0] == "cancel queued":
            started, release = threading.Event(), threading.Event()
            first = asyncio.ensure_future(self.on_device(lambda: (started.set(), release.wait(60))))
            second = asyncio.ensure_future(self.on_device(self.log.append, "second"))
            await await_condition(started.is_set, message="the first job started")
            second.cancel()  # queued behind the first, not started
            await asyncio.sleep(0)
            release.set()
            await first
            await self.on_device(lambda: None)  # every earlier job is done or dropped
            return second.cancelled()
        if isinstance(message, tuple) and message[0] == "thread":
            return await self.on_device(lambda: threading.current_thread().name)
        return await super().receive(message)


async def test_jobs_run_in_order_on_the_worker_thread(actor_system):
    log: list = []
    ref = actor_system.spawn(Props(Worker, "cpu:0", log))
    loop_thread = await ref.ask(("gather", 50), timeout=10)
    assert log == list(range(50))
    worker_thread = await ref.ask(("thread",), timeout=10)
    assert worker_thread != loop_thread and "cpu:0" in worker_thread


async def test_on_device_does_not_block_the_event_loop(actor_system):
    """The job waits for an event that only the event loop can set."""
    ref = actor_system.spawn(Props(DeviceActor, "cpu:0"))
    started, event = threading.Event(), threading.Event()

    def job() -> bool:
        started.set()
        return event.wait(5.0)

    pending = asyncio.ensure_future(ref.ask(OnDevice(job), timeout=10))
    await await_condition(started.is_set, message="the job started on the device thread")
    event.set()  # runs on the loop while the device thread is blocked in event.wait
    assert await pending is True


async def test_a_job_has_no_deadline_and_the_next_waits_behind_it(actor_system):
    """An ask's timeout ends the asker's wait, not the job: the job keeps the
    worker thread (and the actor) until it returns, so a later ask waits
    behind it; a do-nothing job is answered once it is done (a fence)."""
    ref = actor_system.spawn(Props(DeviceActor, "cpu:0"))
    release, log = threading.Event(), []

    def blocked() -> None:
        release.wait(60.0)
        log.append("first")

    with pytest.raises(AskTimeoutError):
        await ref.ask(OnDevice(blocked), timeout=0.05)
    with pytest.raises(AskTimeoutError):  # cannot run while blocked() holds the thread
        await ref.ask(OnDevice(log.append, "second"), timeout=0.05)
    assert log == []
    release.set()
    await ref.ask(OnDevice(lambda: None), timeout=10)
    assert log == ["first", "second"]


async def test_a_job_cancelled_before_it_starts_never_runs(actor_system):
    """on_device's docstring said a cancelled await leaves the job to run on to
    its end; one still queued behind another is dropped instead."""
    log: list = []
    ref = actor_system.spawn(Props(Worker, "cpu:0", log))
    assert await ref.ask(("cancel queued",), timeout=10) is True
    assert log == []


async def test_buffers_stay_on_the_device_and_kernels_run_there(actor_system, rng):
    ref = actor_system.spawn(Props(DeviceActor, "cpu:1"))
    be = backend_for("cpu:1")
    a = rng.standard_normal((6, 4)).astype(np.float32)
    buf = await ref.ask(OnDevice(be.to_device, a), timeout=10)
    out = await ref.ask(OnDevice(be.empty, (6, 6)), timeout=10)
    await ref.ask(OnDevice(be.matmul, buf, buf, out, trans_b=True), timeout=10)
    host = await ref.ask(OnDevice(be.to_host, out), timeout=10)
    np.testing.assert_allclose(host, a @ a.T, rtol=1e-5, atol=1e-5)


async def test_kernel_failure_reaches_the_asker_as_gpu_error(actor_system):
    ref = actor_system.spawn(Props(DeviceActor, "cpu:0"))
    be = backend_for("cpu:0")
    with pytest.raises(OutOfMemory) as info:  # 2**46 floats: more than any host has
        await ref.ask(OnDevice(be.zeros, (1 << 46,)), timeout=10)
    assert isinstance(info.value, GpuError) and isinstance(info.value.__cause__, MemoryError)


async def test_validation_errors_stay_value_errors_and_keep_the_actor(actor_system):
    ref = actor_system.spawn(Props(DeviceActor, "cpu:0"))
    be = backend_for("cpu:0")
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match="inner dimensions"):
        await ref.ask(OnDevice(be.matmul, x, x, np.zeros((2, 3), np.float32)), timeout=10)
    with pytest.raises(TypeError, match="does not handle"):
        await ref.ask("hello", timeout=10)
    assert await ref.ask(OnDevice(lambda: 42), timeout=10) == 42


def test_unknown_device_is_rejected():
    with pytest.raises(ValueError, match="unknown device 'tpu:0'"):
        DeviceActor("tpu:0")


async def test_two_cpu_devices_in_parallel_match_sequential(actor_system, rng):
    """Concurrent matmuls on two CPU device actors give bit-identical results to sequential runs."""
    refs = [actor_system.spawn(Props(DeviceActor, f"cpu:{i}")) for i in range(2)]
    await asyncio.gather(*(r.ask(OnDevice(lambda: None), timeout=10) for r in refs))
    assert BLAS_SHARE.live >= 2
    assert blas_threads() == max(1, BLAS_SHARE.cores // BLAS_SHARE.live)
    be = backend_for("cpu:0")
    inputs = [
        [
            (
                rng.standard_normal((96, 80)).astype(np.float32),
                rng.standard_normal((80, 64)).astype(np.float32),
            )
            for _ in range(6)
        ]
        for _ in refs
    ]

    def run(pairs):
        outs = []
        for a, b in pairs:
            out = np.empty((a.shape[0], b.shape[1]), np.float32)
            be.matmul(a, b, out)
            h = np.empty_like(out)
            be.activation_forward("gelu", out, h)
            outs.append(h)
        return outs

    concurrent = await asyncio.gather(
        *(r.ask(OnDevice(run, p), timeout=30) for r, p in zip(refs, inputs, strict=True))
    )
    sequential = [
        await r.ask(OnDevice(run, p), timeout=30) for r, p in zip(refs, inputs, strict=True)
    ]
    for c, s in zip(concurrent, sequential, strict=True):
        for x, y in zip(c, s, strict=True):
            np.testing.assert_array_equal(x, y)


async def test_blas_share_follows_live_cpu_devices(actor_system):
    before = BLAS_SHARE.live
    refs = [actor_system.spawn(Props(DeviceActor, f"cpu:{i}")) for i in range(3)]
    await asyncio.gather(*(r.ask(OnDevice(lambda: None), timeout=10) for r in refs))
    assert BLAS_SHARE.live == before + 3
    refs[0].stop()
    await await_condition(lambda: BLAS_SHARE.live == before + 2, message="the share dropped")
    assert blas_threads() == max(1, BLAS_SHARE.cores // BLAS_SHARE.live)


class FailsToStart(DeviceActor):
    """Starts its worker, runs a job on it (loading weights, say), then fails."""

    def __init__(self, device: str, asynchronous: bool) -> None:
        super().__init__(device)
        self.asynchronous = asynchronous

    def pre_start(self):
        super().pre_start()
        if self.asynchronous:
            return self._load()
        raise RuntimeError("no checkpoint")

    async def _load(self) -> None:
        await self.on_device(lambda: None)  # the worker thread is running now
        raise RuntimeError("no checkpoint")


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
async def test_failed_pre_start_frees_the_worker_and_blas_share(actor_system, asynchronous):
    """A failed pre_start gets no post_stop: before, the worker thread and the
    BLAS share stayed taken for good (BLAS kept fewer threads in the process)."""
    before = BLAS_SHARE.live
    ref = actor_system.spawn(Props(FailsToStart, "cpu:7", asynchronous))
    await await_condition(lambda: not ref.is_alive, message="the actor stopped")
    await await_condition(lambda: BLAS_SHARE.live == before, message="the share was released")
    await await_condition(
        lambda: all(t.name != "atomr-cpu:7" for t in threading.enumerate()),
        message="the worker thread ended",
    )


@pytest.mark.cuda
async def test_cuda_device_actor(actor_system):
    if not cuda_available():
        pytest.skip("numba.cuda is not available")
    ref = actor_system.spawn(Props(DeviceActor, "cuda:0"))
    be = backend_for("cuda:0")
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2
    buf = await ref.ask(OnDevice(be.to_device, x), timeout=30)
    await ref.ask(OnDevice(be.activation_forward, "relu", buf, buf), timeout=30)
    np.testing.assert_array_equal(
        await ref.ask(OnDevice(be.to_host, buf), timeout=30), np.maximum(x, 0)
    )


@pytest.mark.cuda
async def test_simulator_launches_from_two_actors_are_serialized(actor_system, rng):
    """Two device actors on cuda:0 launching at once still get correct results (one lock)."""
    if not cuda_available():
        pytest.skip("numba.cuda is not available")
    refs = [actor_system.spawn(Props(DeviceActor, "cuda:0")) for _ in range(2)]
    be = backend_for("cuda:0")
    pairs = [
        (
            rng.standard_normal((6, 5)).astype(np.float32),
            rng.standard_normal((5, 7)).astype(np.float32),
        )
        for _ in refs
    ]

    def run(a, b):
        out = be.empty((6, 7))
        for _ in range(3):
            be.matmul(be.to_device(a), be.to_device(b), out)
        return be.to_host(out)

    results = await asyncio.gather(
        *(r.ask(OnDevice(run, a, b), timeout=60) for r, (a, b) in zip(refs, pairs, strict=True))
    )
    for (a, b), got in zip(pairs, results, strict=True):
        np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-5)
