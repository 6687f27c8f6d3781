"""`MpiCollective`: the `Collective` interface across the processes of an MPI job.

Every operation is one non-blocking MPI collective on raw numeric buffers
(mpi4py's uppercase, buffer API; nothing is pickled): `all_reduce` is
`Iallreduce(MPI.IN_PLACE, buf, MPI.SUM)` on the caller's flat float32/float64
array, `broadcast` is `Ibcast`, `barrier` is `Ibarrier`. Operations run one at
a time, in submission order (MPI requires the same order of collectives on
every rank; a caller that is cancelled leaves its operation running), and
never block the event loop, so the actors on it keep working while a
collective is in flight.

Cost. An operation submitted while the collective is idle is started by
its caller, on the loop's thread, and tested there (each test also advances
MPI's progress engine) for up to 10 ms: no task, no thread hand-off, no
copies (`MPI.IN_PLACE` on the caller's array), no timer. Tests run in
bursts with a yield to the loop between them: 0.1 ms while other work is
waiting on the loop, growing to 1 ms while it is idle (a yield stalls the
collective on every rank for a moment), so the loop is held about 1 ms at
most at a time (one test can run past a burst's end). An operation still running after that (a large buffer,
or a late peer) is *parked*: the collective's MPI thread blocks in `Wait` on
it, so a long wait holds neither the GIL nor the loop, and wakes the loop
once when it completes. Operations submitted meanwhile queue behind it and
are run, in order, by one driver task. Local numpy work (summing several
local buffers, dividing for a mean) runs on the loop below 1 MiB and on the
MPI thread above.

Failure detection costs nothing until something is slow. When an operation
has not completed `timeout` seconds after it started, the rank sends every
other rank a *note* (the number of the operation it is in: one int64,
`Isend` on a private duplicate of the communicator) and waits up to
`min(max(timeout, 1 s), 5 s)` for theirs. A live rank inside a parked
collective answers within 0.2 s; a rank that is dead, or stuck outside the
collectives, never does. The call then raises `CollectiveTimeoutError` naming
the ranks that did not answer for this operation (with the operation a rank
is at when it answered for another one: out of step). An error reported by
MPI itself raises `RankFailedError`, after the same exchange. After either,
the collective is broken (its MPI thread may be stuck inside MPI for good):
operations queued behind the failed one and later calls raise at once, and
the program should report the error and call `abort()`, which ends the whole
job through `MPI_Abort`. The notes are exchanged from the event loop's thread
while the MPI thread is blocked, which needs `MPI_THREAD_MULTIPLE` (the
`mpich` wheel gives it); with less, the timeout still fires but cannot name
the rank.

mpi4py is imported when the first `MpiCollective` is made, not when this
module is imported; without it the constructor raises an `ImportError` that
names the `atomr[mpi]` extra.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, NoReturn

import numpy as np

from atomr.train.comm.collective import Collective
from atomr.train.comm.mpi._notes import FailureNotes, describe_missing
from atomr.train.comm.mpi.errors import CollectiveError, CollectiveTimeoutError, RankFailedError

__all__ = [
    "CollectiveError",
    "CollectiveTimeoutError",
    "MpiCollective",
    "RankFailedError",
    "import_mpi",
]

_OPS = ("sum", "mean")
_POLL_S = 0.2  # a parked operation looks for peers' notes this often
_SPIN_S = 0.010  # test a started operation from the loop this long before parking it
_BURST_MIN_S = 100e-6  # ... in bursts of tests between yields to the loop: this long
_BURST_MAX_S = 1e-3  # ... up to this long while the loop has nothing else to run
_IDLE_YIELD_S = 50e-6  # a yield back within this found nothing else to run
_INLINE_BYTES = 1 << 20  # local numpy work on fewer bytes runs on the loop
_GRACE_S = 5.0  # the longest a failed rank waits for the others' notes
_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def import_mpi() -> Any:
    """Import and return `mpi4py.MPI` (initialising MPI on first use).

    Raises:
        ImportError: mpi4py is not installed; the message names the
            `atomr[mpi]` extra.
    """
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise ImportError(
            f"the MPI backend needs mpi4py and an MPI library: pip install 'atomr[mpi]' ({exc})"
        ) from exc
    return MPI


class _Operation:
    """One collective, queued for the driver: its number, the non-blocking MPI
    call that starts it, and the local numpy work before and after."""

    __slots__ = ("after", "before", "future", "kind", "offload", "seq", "start")

    def __init__(
        self,
        seq: int,
        kind: str,
        future: asyncio.Future[None],
        start: Callable[[], Any],
        before: Callable[[], None] | None = None,
        after: Callable[[], None] | None = None,
        offload: bool = False,
    ) -> None:
        self.seq = seq
        self.kind = kind
        self.future = future  # awaited by the caller; settled by the driver
        self.start = start  # starts the MPI call; returns its request (None: nothing to do)
        self.before = before
        self.after = after
        self.offload = offload  # before/after touch enough memory to run off the loop

    @property
    def name(self) -> str:
        return f"{self.kind} #{self.seq}"


class _Worker(threading.Thread):
    """The collective's MPI thread: runs blocking calls (a parked request's
    `Wait`, large local numpy work) one at a time and wakes the loop once per
    call with `call_soon_threadsafe`.

    A daemon thread, so a call stuck in MPI (a dead peer) never keeps the
    interpreter from exiting.
    """

    def __init__(self, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.jobs: queue.SimpleQueue[
            tuple[Callable[[], Any], asyncio.AbstractEventLoop, asyncio.Future[None]] | None
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
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting
                loop.call_soon_threadsafe(_settle, future, error)


def _settle(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(None)


class MpiCollective(Collective):
    """`all_reduce`, `broadcast` and `barrier` across the processes of an MPI job.

    Every rank of the communicator must create its `MpiCollective` at the
    same point of the program (the constructor duplicates the communicator,
    a collective call) and then issue the same operations in the same order.

    Args:
        comm: an mpi4py communicator (default: `MPI.COMM_WORLD`).
        timeout: seconds an operation may take, from the moment it starts
            (after the operations queued before it), before it fails with
            `CollectiveTimeoutError` naming the ranks that never joined; None
            waits forever.

    Raises:
        ImportError: mpi4py is not installed (`pip install 'atomr[mpi]'`).
        ValueError: `timeout` is not positive.
        RuntimeError: the MPI library gives less than
            `MPI_THREAD_SERIALIZED` (calls from a worker thread would be unsafe).
    """

    def __init__(self, comm: Any = None, *, timeout: float | None = 300.0) -> None:
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be positive or None, got {timeout}")
        mpi = import_mpi()
        self._mpi = mpi
        level = mpi.Query_thread()
        if level < mpi.THREAD_SERIALIZED:
            raise RuntimeError(
                "MpiCollective runs MPI calls on a worker thread and needs "
                f"MPI_THREAD_SERIALIZED or better; this MPI gives level {level}"
            )
        base = mpi.COMM_WORLD if comm is None else comm
        self._comm = base.Dup()
        self._ctl = base.Dup()
        for c in (self._comm, self._ctl):
            c.Set_errhandler(mpi.ERRORS_RETURN)
        self.rank: int = self._comm.Get_rank()
        self.world_size: int = self._comm.Get_size()
        self.timeout = timeout
        self._seq = 0  # the number of the last operation submitted
        self._current = 0  # the number of the operation the driver is in (or last ran)
        self._broken: RankFailedError | None = None
        self._worker: _Worker | None = None
        # operations submitted and not yet finished, in order; one driver task runs them
        self._queue: deque[_Operation] = deque()
        self._driver: asyncio.Task[None] | None = None
        self._burst_s = _BURST_MIN_S  # see _spin
        self._busy = False  # an operation is in flight (the fast path's or the driver's)
        self._in_place, self._sum = mpi.IN_PLACE, mpi.SUM
        # how often a parked operation looks for peers' notes, and how long a
        # rank that ran past its timeout waits for the others' notes
        self._poll_s = _POLL_S if timeout is None else min(_POLL_S, timeout / 4)
        self._spin_s = min(_SPIN_S, self._poll_s)
        grace_s = _GRACE_S if timeout is None else min(max(timeout, 1.0), _GRACE_S)
        # naming a missing rank exchanges notes from the event loop's thread
        # while the MPI thread is blocked: only legal with MULTIPLE
        self._notes = FailureNotes(
            mpi, self._ctl, enabled=level >= mpi.THREAD_MULTIPLE, grace_s=grace_s
        )

    @classmethod
    def from_config(cls, config: Any, comm: Any = None) -> MpiCollective:
        """A collective for a `DistributedTrainConfig`, checked against MPI.

        Args:
            config: the `DistributedTrainConfig` (its `collective_timeout` is used).
            comm: the communicator (default: `MPI.COMM_WORLD`).

        Raises:
            ValueError: the config's rank / world size differ from MPI's.
            ImportError: see the class.
        """
        coll = cls(comm, timeout=config.collective_timeout)
        if (coll.rank, coll.world_size) != (config.rank, config.world_size):
            raise ValueError(
                f"config says rank {config.rank} of {config.world_size}, MPI says "
                f"rank {coll.rank} of {coll.world_size}"
            )
        return coll

    # -- the Collective interface ---------------------------------------------

    async def all_reduce(self, buffers: Sequence[Any] | np.ndarray, op: str = "sum") -> np.ndarray:
        """Sum (or average) this process's buffers with every other rank's, in place.

        The local buffers are first summed into `buffers[0]`, then one
        `Iallreduce(MPI.IN_PLACE)` sums `buffers[0]` across the ranks. Every
        rank ends with the same bits.

        Args:
            buffers: this process's contributions: a C-contiguous, writable
                float32 or float64 array, or a list of such arrays of one
                shape and dtype (every rank passing the same shape, dtype
                and number of buffers).
            op: "sum", or "mean" (the sum divided by the number of
                contributions, `world_size * len(buffers)`).

        Returns:
            `buffers[0]` (the array itself when one array was given), holding
            the result.

        Raises:
            TypeError: not numpy arrays, or a dtype other than float32/float64.
            ValueError: no buffers, mixed shapes / dtypes, non-contiguous or
                read-only `buffers[0]`, or an unknown `op`.
            CollectiveTimeoutError: the operation did not complete in time;
                names the ranks that never joined.
            RankFailedError: MPI reported a failure, or an earlier operation
                failed (the collective is broken).
        """
        if op not in _OPS:
            raise ValueError(f"op must be one of {_OPS}, got {op!r}")
        bufs = _check(buffers)
        target = bufs[0]
        local = len(bufs) > 1 or op == "mean"
        await self._submit(
            "all_reduce",
            self._start_all_reduce,
            target,
            before=partial(_sum_into, target, bufs[1:]) if len(bufs) > 1 else None,
            after=partial(_divide, target, self.world_size * len(bufs)) if op == "mean" else None,
            offload=local and target.nbytes * len(bufs) >= _INLINE_BYTES,
        )
        return target

    async def broadcast(self, buffers: Sequence[Any] | np.ndarray, root: int = 0) -> None:
        """Copy rank `root`'s `buffers[0]` into every buffer of every rank.

        Args:
            buffers: this process's buffers (an array or a list of arrays of
                one shape and dtype; the same shape and dtype on every rank).
            root: the rank whose `buffers[0]` is copied.

        Raises:
            IndexError: `root` is not a rank of the communicator.
            TypeError, ValueError: as `all_reduce`; also a read-only buffer.
            CollectiveTimeoutError, RankFailedError: as `all_reduce`.
        """
        if isinstance(root, bool) or not isinstance(root, int) or not 0 <= root < self.world_size:
            raise IndexError(f"root {root!r} is not a rank of this {self.world_size}-rank group")
        bufs = _check(buffers)
        for k in range(1, len(bufs)):  # buffers[0] is checked by _check
            if not bufs[k].flags.writeable:
                raise ValueError(f"buffers[{k}] must be writable (broadcast writes every buffer)")
        await self._submit(
            "broadcast",
            partial(self._start_broadcast, root=root),
            bufs[0],
            after=partial(_copy_into, bufs[1:], bufs[0]) if len(bufs) > 1 else None,
            offload=len(bufs) > 1 and bufs[0].nbytes * len(bufs) >= _INLINE_BYTES,
        )

    async def barrier(self) -> None:
        """Return once every rank has reached the barrier (`MPI_Ibarrier`).

        Raises:
            CollectiveTimeoutError, RankFailedError: as `all_reduce`.
        """
        await self._submit("barrier", self._start_barrier, None)

    # -- lifecycle ----------------------------------------------------------------

    @property
    def broken(self) -> bool:
        """True once an operation has failed (every later call raises)."""
        return self._broken is not None

    def abort(self, errorcode: int = 1, message: str | None = None, grace: float = 0.5) -> NoReturn:
        """End the whole MPI job: report `message`, then `MPI_Abort`.

        Use it after a `CollectiveError`: MPI cannot be finalised cleanly when
        a rank is gone, and a rank that never joined would otherwise keep the
        job alive. Does not return.

        Args:
            errorcode: the job's exit code.
            message: printed to stderr first, prefixed with this rank.
            grace: seconds to wait before aborting, so the other ranks'
                reports reach the log too.
        """
        if message:
            print(f"[rank {self.rank}] {message}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        time.sleep(max(0.0, grace))
        # MPICH's launcher ends every process only for an abort on COMM_WORLD.
        self._mpi.COMM_WORLD.Abort(errorcode)
        os._exit(errorcode)  # MPI_Abort may return before the launcher acts

    def close(self) -> None:
        """Stop the MPI thread once its current call is done (a later
        operation starts a new one). Does nothing to the communicator."""
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.jobs.put(None)
        if self._broken is None:
            self._notes.close()

    # -- machinery ------------------------------------------------------------------
    #
    # An operation goes through: local work before, start the non-blocking
    # MPI call, test it from the loop for up to `_spin_s` (`_spin`), park it
    # on the MPI thread (`_park`: `Wait`), local work after. `_submit` runs
    # the first steps itself when the collective is idle (the fast path) and
    # hands the rest to a driver task (`_drive`) when the operation outlives
    # the spin; operations submitted while another is in flight queue for
    # the driver. Only a parked operation can time out or talk to peers
    # (`FailureNotes`): every `_poll_s` it answers peers' notes; past its
    # deadline, it asks every peer where it is and names those that never
    # answer for this operation.

    def _start_all_reduce(self, target: np.ndarray) -> Any:
        if self.world_size == 1:
            return None
        return self._comm.Iallreduce(self._in_place, target, op=self._sum)

    def _start_broadcast(self, buffer: np.ndarray, root: int) -> Any:
        return self._comm.Ibcast(buffer, root=root) if self.world_size > 1 else None

    def _start_barrier(self, _: None) -> Any:
        return self._comm.Ibarrier() if self.world_size > 1 else None

    async def _submit(
        self,
        kind: str,
        start: Callable[[Any], Any],
        arg: Any,
        *,
        before: Callable[[], None] | None = None,
        after: Callable[[], None] | None = None,
        offload: bool = False,
    ) -> None:
        if self._broken is not None:
            raise self._unusable()
        self._seq += 1
        seq = self._seq
        if self._busy or offload:  # behind other operations, or heavy local work
            operation = self._operation(seq, kind, partial(start, arg), before, after, offload)
            self._queue.append(operation)
            if not self._busy:
                self._start_driver()
            await operation.future  # a cancelled caller leaves the operation running
            return
        # Fast path: the collective is idle, so this caller starts its own
        # operation and tests it: no task, no future, no hand-off (on a 1 MB
        # buffer every object touched here costs cache misses). An operation
        # still running after `_spin_s`, or a failure, goes to a driver task.
        self._busy = True
        self._current = seq
        started = time.monotonic()
        request: Any = None
        failure: Exception | None = None
        cancelled: asyncio.CancelledError | None = None
        try:
            if before is not None:
                before()
            request = start(arg)
            if request is None or await self._spin(request):
                if after is not None:
                    after()
                self._busy = False
                if self._queue:  # submitted while this one was in flight
                    self._start_driver()
                return
        except asyncio.CancelledError as exc:  # the operation goes on without its caller
            cancelled = exc
        except Exception as exc:
            failure = exc
        operation = self._operation(seq, kind, partial(start, arg), before, after, offload)
        self._queue.appendleft(operation)
        self._start_driver((request, started, failure))
        if cancelled is not None:
            raise cancelled
        await operation.future

    def _operation(
        self,
        seq: int,
        kind: str,
        start: Callable[[], Any],
        before: Callable[[], None] | None,
        after: Callable[[], None] | None,
        offload: bool,
    ) -> _Operation:
        future = asyncio.get_running_loop().create_future()
        return _Operation(seq, kind, future, start, before, after, offload)

    def _start_driver(self, resume: tuple[Any, float, Exception | None] | None = None) -> None:
        self._busy = True
        self._driver = asyncio.get_running_loop().create_task(
            self._drive(resume), name=f"atomr-mpi-rank{self.rank}"
        )

    async def _drive(self, resume: tuple[Any, float, Exception | None] | None = None) -> None:
        """Run the queued operations one at a time, in submission order
        (`resume`: the first one was started by the fast path)."""
        queued = self._queue
        try:
            while queued:
                operation = queued[0]
                if self._broken is not None:
                    error: BaseException | None = self._unusable()
                elif resume is not None:
                    error = await self._run(operation, *resume)
                else:
                    self._current = operation.seq
                    error = await self._run(operation)
                resume = None
                queued.popleft()
                _settle(operation.future, error)
        except asyncio.CancelledError:  # the loop is shutting down mid-operation
            if self._broken is None and queued:
                self._broken = RankFailedError(
                    f"MPI {queued[0].name} on rank {self.rank} was cancelled in flight "
                    "(its event loop stopped)",
                    operation=queued[0].name,
                )
            while queued:
                _settle(queued.popleft().future, self._unusable())
            raise
        finally:
            self._driver = None
            self._busy = False

    async def _run(
        self,
        operation: _Operation,
        request: Any = None,
        started: float | None = None,
        failure: Exception | None = None,
    ) -> RankFailedError | None:
        """Run one operation, or resume one the fast path started (`request`
        still running since `started`, or `failure` raised). Returns the
        error for its caller, if any (and then the collective is broken)."""
        try:
            if failure is not None:
                raise failure  # reported below like any failure here
            if started is None:
                started = time.monotonic()
                if operation.before is not None:
                    await self._local(operation.before, operation.offload)
                request = operation.start()
                if request is not None and await self._spin(request):
                    request = None
            if request is not None:
                await self._park(operation, request, started)
            if operation.after is not None:
                await self._local(operation.after, operation.offload)
        except RankFailedError as exc:
            return exc
        except self._mpi.Exception as exc:
            missing = await self._notes.gather(operation.seq, self._current)
            return self._fail(operation, missing, f"MPI error: {exc}")
        except Exception as exc:  # local work failed: this rank is out of step now
            return self._fail(operation, {}, f"failed on this rank: {exc!r}")
        return None

    async def _local(self, fn: Callable[[], None], offload: bool) -> None:
        if offload:
            await self._on_worker(fn)
        else:
            fn()

    def _on_worker(self, fn: Callable[[], Any]) -> asyncio.Future[None]:
        """Run `fn` on the MPI thread; the future settles when it returns."""
        worker = self._worker
        if worker is None:
            worker = self._worker = _Worker(f"atomr-mpi-rank{self.rank}")
            worker.start()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        worker.jobs.put((fn, loop, future))
        return future

    async def _spin(self, request: Any) -> bool:
        """Test `request` from the loop for up to `_spin_s`; True when it completed.

        Tests run in bursts with a yield to the loop between them. Each yield
        stalls the collective on every rank for a moment, so the bursts adapt:
        a yield that found nothing else to run doubles the next burst (up to
        `_BURST_MAX_S`), one that ran other work shortens it to `_BURST_MIN_S`.
        The length carries over to the next operation.
        """
        clock = time.monotonic
        now = clock()
        end = now + self._spin_s
        burst = self._burst_s
        while True:
            stop = now + burst
            while True:
                if request.Test():
                    self._burst_s = burst
                    return True
                now = clock()
                if now >= stop:
                    break
            if now >= end:
                self._burst_s = burst
                return False
            await asyncio.sleep(0)
            then, now = now, clock()
            burst = min(2 * burst, _BURST_MAX_S) if now - then < _IDLE_YIELD_S else _BURST_MIN_S

    async def _park(self, operation: _Operation, request: Any, started: float) -> None:
        """Wait for `request` on the MPI thread, enforcing the deadline and
        answering peers' notes meanwhile."""
        done = self._on_worker(request.Wait)
        timeout = self.timeout
        while True:
            wait = self._poll_s
            if timeout is not None:
                wait = min(wait, max(0.0, started + timeout - time.monotonic()))
            await asyncio.wait((done,), timeout=wait)
            if done.done():
                done.result()  # an MPI error is raised here
                return
            self._notes.poll(self._current)
            if timeout is not None and time.monotonic() - started >= timeout:
                missing = await self._notes.gather(operation.seq, self._current, until=done)
                if not done.done():
                    raise self._fail(operation, missing, f"timed out after {timeout:g} s")
                if done.exception() is None:  # completed during the diagnosis
                    return
                missing = await self._notes.gather(operation.seq, self._current)
                raise self._fail(operation, missing, f"MPI error: {done.exception()}")

    def _unusable(self) -> RankFailedError:
        assert self._broken is not None
        return RankFailedError(
            f"collective unusable after an earlier failure: {self._broken}",
            ranks=self._broken.ranks,
            operation=self._broken.operation,
        )

    def _fail(
        self, operation: _Operation, others: dict[int, int | None] | None, what: str
    ) -> RankFailedError:
        """The error for a failed operation; marks the collective broken."""
        where = f"MPI {operation.name} on rank {self.rank} of {self.world_size} {what}"
        detail = describe_missing(others)
        cls = CollectiveTimeoutError if what.startswith("timed out") else RankFailedError
        error = cls(f"{where}: {detail}", ranks=list(others or ()), operation=operation.name)
        if self._broken is None:
            self._broken = error
        return error


def _sum_into(target: np.ndarray, others: Sequence[np.ndarray]) -> None:
    for other in others:
        np.add(target, other, out=target)


def _divide(target: np.ndarray, count: int) -> None:
    np.divide(target, target.dtype.type(count), out=target)


def _copy_into(targets: Sequence[np.ndarray], source: np.ndarray) -> None:
    for target in targets:
        np.copyto(target, source)


def _check(buffers: Sequence[Any] | np.ndarray) -> list[np.ndarray]:
    """Validate this process's buffers; returns them as a list."""
    if type(buffers) is np.ndarray and buffers.dtype in _DTYPES and buffers.flags.carray:
        return [buffers]  # the common case, checked in one go
    if isinstance(buffers, np.ndarray):
        bufs = [buffers]
    elif isinstance(buffers, Sequence) and not isinstance(buffers, str | bytes):
        bufs = list(buffers)
    else:
        raise TypeError(
            f"buffers must be an array or a list of arrays, got {type(buffers).__name__}"
        )
    if not bufs:
        raise ValueError("a collective needs at least one buffer")
    for k, b in enumerate(bufs):
        if not isinstance(b, np.ndarray):
            raise TypeError(f"buffers[{k}] must be a numpy array, got {type(b).__name__}")
        if b.dtype not in _DTYPES:
            raise TypeError(
                f"buffers[{k}] has dtype {b.dtype}; MPI collectives take float32 or float64"
            )
        if b.shape != bufs[0].shape or b.dtype != bufs[0].dtype:
            raise ValueError(
                f"buffers[{k}] is {b.dtype}{b.shape}, buffers[0] is "
                f"{bufs[0].dtype}{bufs[0].shape}; all must match"
            )
    if not bufs[0].flags.c_contiguous:
        raise ValueError("buffers[0] must be C-contiguous (MPI works on the raw memory)")
    if not bufs[0].flags.writeable:
        raise ValueError("buffers[0] must be writable (the result is written in place)")
    return bufs
