"""DeviceActor: an actor that owns one device and the worker thread its work runs on.

The worker thread is the device's "stream": ``await self.on_device(fn, ...)``
runs ``fn`` there, in submission order, without blocking the event loop,
and returns its result. Failures inside come back as a ``GpuError``
(``atomr.accel.translate``); ``ValueError`` / ``TypeError`` from input
validation stay as they are. Buffers stay on the device; they are copied
only when asked (``backend.to_host``).

CPU device actors share the BLAS thread pool (``atomr.accel.threads``);
CUDA device actors make their device current on their worker thread.

A plain ``DeviceActor`` also answers ``OnDevice(fn, *args)`` messages, so a
trainer can use it without subclassing; subclasses implement ``receive``
and call ``on_device`` themselves (calling ``super().receive`` for
``OnDevice`` if they want it too).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from atomr.accel.backend import Backend, backend_for
from atomr.accel.device import Device
from atomr.accel.job_timing import JobTiming
from atomr.accel.serial_worker import SerialWorker
from atomr.accel.threads import BLAS_SHARE
from atomr.accel.translate import translate_error
from atomr.actor import Actor, Failure, not_handled

__all__ = ["DeviceActor", "OnDevice"]

T = TypeVar("T")


class OnDevice:
    """Message: run ``fn(*args, **kwargs)`` on the device actor's worker thread.

    The ask is answered with fn's return value, or fails with the GpuError
    (or ValueError / TypeError) it raised. The ask's timeout does not stop
    fn: it runs to its end, and the actor handles nothing else meanwhile
    (see ``DeviceActor.on_device``).

    Args:
        fn: the function; it receives plain arguments (use ``backend`` inside).
        *args: its positional arguments.
        **kwargs: its keyword arguments.
    """

    __slots__ = ("args", "fn", "kwargs")

    def __init__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        if not callable(fn):
            raise TypeError(f"OnDevice needs a callable, got {type(fn).__name__}")
        self.fn = fn
        self.args = args
        self.kwargs = kwargs

    def __repr__(self) -> str:
        return f"OnDevice({getattr(self.fn, '__name__', self.fn)!s}, {len(self.args)} args)"


def _select_cuda(index: int) -> None:
    """Worker-thread initializer of a CUDA device actor: make its device current."""
    from numba import cuda

    from atomr.accel.sim_lock import launch_lock

    with launch_lock():
        cuda.select_device(index)


def _stopping_worker_on_failure(hook: Callable[..., Any]) -> Callable[..., Any]:
    """``hook`` (a start hook of a DeviceActor subclass, sync or async), which
    stops the actor's worker when it raises; what it raised goes on."""

    async def awaited(actor: DeviceActor, started: Awaitable[Any]) -> Any:
        try:
            return await started
        except BaseException:
            actor._stop_worker()
            raise

    @functools.wraps(hook)
    def run(self: DeviceActor, *args: Any) -> Any:
        try:
            started = hook(self, *args)
        except BaseException:
            self._stop_worker()
            raise
        return awaited(self, started) if inspect.isawaitable(started) else started

    return run


class DeviceActor(Actor):
    """An actor that owns one device and one worker thread.

    Args:
        device: the device ("cpu:0", "cuda:1" or a Device).

    Raises:
        ValueError: unknown device name, or no such CUDA device.

    Attributes:
        device: the Device.
        backend: its Backend (kernels and memory).
        inline_below_s: class attribute, 0 (off) by default. Above 0, on a CPU
            device, jobs that ran shorter than this (seconds) their last times
            run on the event loop's thread when the worker is idle: a small
            model's step then costs no thread hops (`JobTiming`). Off by
            default because a job that is usually short but turns slow (a far
            larger batch, a stall) then blocks the event loop, and every
            deadline on it fires late. Set it on a subclass
            (`class FastTrainer(Trainer): inline_below_s = 2e-4`).
    """

    inline_below_s: float = 0.0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Wrap a subclass's own ``pre_start`` / ``post_restart`` so that a
        failure in it (or a stop while it is awaited) shuts the worker down:
        an actor whose start failed gets no ``post_stop``, and its worker
        thread and BLAS share would stay taken for the life of the process."""
        super().__init_subclass__(**kwargs)
        for hook in ("pre_start", "post_restart"):
            fn = cls.__dict__.get(hook)
            if inspect.isfunction(fn):
                setattr(cls, hook, _stopping_worker_on_failure(fn))

    def __init__(self, device: Device | str = "cpu:0") -> None:
        super().__init__()
        self.device: Device = Device.parse(device)
        self.backend: Backend = backend_for(self.device)
        self._worker: SerialWorker | None = None
        self._holds_blas_share = False
        # CPU jobs known to be short may run inline (`job_timing.py`); a CUDA
        # device's jobs stay on the thread that holds its context
        inline = self.inline_below_s > 0 and not self.device.is_cuda
        self._timing = JobTiming(self.inline_below_s) if inline else None

    # ------------------------------------------------------------ life cycle

    def pre_start(self) -> Any:
        """Start the worker thread (and take a BLAS share for a CPU device).

        Subclasses overriding it must call ``super().pre_start()``. When a
        subclass's ``pre_start`` (or ``post_restart``) raises, or the actor is
        stopped while it is awaited, the worker is shut down again (no
        ``post_stop`` runs for an actor that did not start).
        """
        self._start_worker()
        return None

    def post_stop(self) -> Any:
        """Shut the worker thread down (the running job, if any, finishes) and release BLAS.

        An idle worker thread has ended when this returns; one running a job
        ends after that job (it is not waited for).

        Subclasses overriding it must call ``super().post_stop()``.
        """
        self._stop_worker()
        return None

    def _start_worker(self) -> None:
        if self._worker is not None:
            return
        name = f"atomr-{self.device}"
        if self.device.is_cuda:
            self._worker = SerialWorker(name, functools.partial(_select_cuda, self.device.index))
        else:
            self._worker = SerialWorker(name)
            BLAS_SHARE.acquire()
            self._holds_blas_share = True

    def _stop_worker(self) -> None:
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.close()
        if self._holds_blas_share:
            self._holds_blas_share = False
            BLAS_SHARE.release()

    # ------------------------------------------------------------ device work

    async def on_device(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` on this actor's worker thread and await its result.

        Jobs run one at a time, in the order they were submitted; the event loop
        keeps running meanwhile. Opt-in (`inline_below_s > 0`, CPU devices): a
        job whose function has run shorter than that its last times runs on the
        event loop's thread instead, when the worker is idle, since two thread
        wake-ups cost more than such a job (`atomr/accel/job_timing.py`).

        A job has no deadline: cancelling this await (``asyncio.timeout``, a
        cancelled task, the actor stopping) stops waiting for ``fn``. A job
        that has started runs on to its end (a thread cannot be cancelled),
        and the jobs submitted after it wait behind it; one still queued
        behind another job is dropped and never runs (the actor stopping
        drops every queued job). Keep jobs short; to wait until a job that
        was cancelled is done, run a job that does nothing (it runs after
        every earlier one), as the trainers' fence does.

        Args:
            fn: the function.
            *args: its positional arguments.
            **kwargs: its keyword arguments.

        Returns:
            fn's return value.

        Raises:
            GpuError: a subclass chosen by ``translate_error`` (the original as ``__cause__``).
            ValueError, TypeError: as raised by fn (input validation).
            RuntimeError: the worker is not running (before ``pre_start`` or after stop).
        """
        worker = self._worker
        if worker is None:
            raise RuntimeError(f"DeviceActor on {self.device}: the worker thread is not running")
        job: Callable[[], T] = functools.partial(fn, *args, **kwargs)
        timing = self._timing
        try:
            if timing is None:
                return await worker.submit(job)
            key = timing.key(job)  # derived once for the decision and the record
            if timing.inline(job, key):
                return timing.run(job, key)  # short, and the worker is idle
            timing.in_flight += 1
            try:
                return await worker.submit(timing.timed(job, key))
            finally:
                timing.in_flight -= 1
        except Exception as exc:
            error = translate_error(exc, str(self.device))
            if error is exc:
                raise
            raise error from exc

    async def receive(self, message: Any) -> Any:
        """Answer ``OnDevice`` messages with the function's result.

        Args:
            message: an ``OnDevice``.

        Returns:
            The function's result; ``Failure(exc)`` when it raised ValueError or
            TypeError, and ``Failure(TypeError)`` for any other message (in both
            cases the actor does not fail).

        Raises:
            GpuError: when the function fails on the device (the parent supervises).
        """
        if isinstance(message, OnDevice):
            try:
                return await self.on_device(message.fn, *message.args, **message.kwargs)
            except (ValueError, TypeError) as exc:
                return Failure(exc)  # bad input: answer the asker, keep the actor
        return not_handled(type(self).__name__, message)
