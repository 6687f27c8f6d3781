"""`OperationDriver`: how `MpiCollective` runs its non-blocking MPI calls
without blocking the event loop, one at a time, and fails loudly.

Operations run in submission order (MPI requires the same order of
collectives on every rank; a caller that is cancelled leaves its operation
running), and never block the event loop, so the actors on it keep working
while a collective is in flight.

Cost. An operation submitted while the driver is idle is started by its
caller, on the loop's thread, and tested there (each test also advances
MPI's progress engine) for up to 10 ms: no task, no thread hand-off, no
copies, no timer. Tests run in bursts with a yield to the loop between them:
0.1 ms while other work is waiting on the loop, growing to 1 ms while it is
idle (a yield stalls the collective on every rank for a moment), so the loop
is held about 1 ms at most at a time (one test can run past a burst's end).
An operation still running after that (a large buffer, or a late peer) is
*parked*: the driver's MPI thread blocks in `Wait` on it, so a long wait
holds neither the GIL nor the loop, and wakes the loop once when it
completes. Operations submitted meanwhile queue behind it and are run, in
order, by one driver task. Local numpy work before and after the MPI call
runs on the loop below 1 MiB and on the MPI thread above.

Failure detection costs nothing until something is slow. When an operation
has not completed `timeout` seconds after it started, the rank asks its
peers where they are (`FailureNotes`, in `_notes.py`) and raises
`CollectiveTimeoutError` naming the ranks that never joined. An error
reported by MPI itself raises `RankFailedError`, after the same exchange.
After either, the driver is broken (its MPI thread may be stuck inside MPI
for good): operations queued behind the failed one and later calls raise at
once.

Its life, for one operation: local work before, start the non-blocking MPI
call, test it from the loop for up to `_spin_s` (`_spin`), park it on the
MPI thread (`_park`: `Wait`), local work after. `submit` runs the first
steps itself when the driver is idle (the fast path) and hands the rest to
a driver task (`_drive`) when the operation outlives the spin. Only a parked
operation can time out or talk to peers: every `_poll_s` it answers peers'
notes; past its deadline, it asks every peer where it is and names those
that never answer for this operation.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any

from atomr.train.comm.mpi._notes import FailureNotes, describe_missing
from atomr.train.comm.mpi._worker import MpiThread, settle
from atomr.train.comm.mpi.errors import CollectiveTimeoutError, RankFailedError

__all__ = ["OperationDriver"]

_POLL_S = 0.2  # a parked operation looks for peers' notes this often
_SPIN_S = 0.010  # test a started operation from the loop this long before parking it
_BURST_MIN_S = 100e-6  # ... in bursts of tests between yields to the loop: this long
_BURST_MAX_S = 1e-3  # ... up to this long while the loop has nothing else to run
_IDLE_YIELD_S = 50e-6  # a yield back within this found nothing else to run


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


class OperationDriver:
    """Runs one rank's MPI operations in order, off the loop's critical path,
    each within `timeout` (see the module docstring).

    Args:
        mpi: the `mpi4py.MPI` module.
        rank, world_size: this rank's place in the communicator.
        timeout: seconds an operation may take from the moment it starts,
            or None to wait forever.
        notes: the failure-note exchange with the peers.
    """

    def __init__(
        self, mpi: Any, rank: int, world_size: int, timeout: float | None, notes: FailureNotes
    ) -> None:
        self._mpi = mpi
        self.rank = rank
        self.world_size = world_size
        self.timeout = timeout
        self._notes = notes
        self._seq = 0  # the number of the last operation submitted
        self._current = 0  # the number of the operation the driver is in (or last ran)
        self.broken: RankFailedError | None = None
        """The error of the operation that failed; every later one raises."""
        self._worker: MpiThread | None = None
        # operations submitted and not yet finished, in order; one driver task runs them
        self._queue: deque[_Operation] = deque()
        self._driver: asyncio.Task[None] | None = None
        self._burst_s = _BURST_MIN_S  # see _spin
        self._busy = False  # an operation is in flight (the fast path's or the driver's)
        # how often a parked operation looks for peers' notes
        self._poll_s = _POLL_S if timeout is None else min(_POLL_S, timeout / 4)
        self._spin_s = min(_SPIN_S, self._poll_s)

    async def submit(
        self,
        kind: str,
        start: Callable[[Any], Any],
        arg: Any,
        before: Callable[[], None] | None = None,
        after: Callable[[], None] | None = None,
        offload: bool = False,
    ) -> None:
        """Run one operation: `before()`, `start(arg)` (the non-blocking MPI
        call; returns its request, or None when there is nothing to wait
        for), its completion, then `after()`. A cancelled caller leaves the
        operation running.

        Args:
            kind: the operation's name in errors, e.g. "all_reduce".
            offload: run `before` / `after` on the MPI thread.

        Raises:
            CollectiveTimeoutError: not complete within `timeout`.
            RankFailedError: MPI or the local work failed, or an earlier
                operation did (the driver is broken).
        """
        if self.broken is not None:
            raise self._unusable()
        self._seq += 1
        seq = self._seq
        if self._busy or offload:  # behind other operations, or heavy local work
            await self._enqueue(seq, kind, partial(start, arg), before, after, offload)
            return
        # The fast path: the driver is idle, so this caller starts its own
        # operation and tests it: no task, no future, no hand-off (on a 1 MB
        # buffer every object touched here costs cache misses). An operation
        # still running after `_spin_s`, or a failure, goes to a driver task.
        self._busy = True
        self._current = seq
        started = time.monotonic()
        request: Any = None
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
        except asyncio.CancelledError:  # the operation goes on without its caller
            self._enqueue(
                seq, kind, partial(start, arg), before, after, resume=(request, started, None)
            )
            raise
        except Exception as exc:
            failure: Exception | None = exc
        else:
            failure = None  # still running after the spin
        await self._enqueue(
            seq, kind, partial(start, arg), before, after, resume=(request, started, failure)
        )

    def close(self) -> None:
        """Stop the MPI thread once its current call is done (a later
        operation starts a new one)."""
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.jobs.put(None)

    # -- the driver task ------------------------------------------------------------

    def _enqueue(
        self,
        seq: int,
        kind: str,
        start: Callable[[], Any],
        before: Callable[[], None] | None,
        after: Callable[[], None] | None,
        offload: bool = False,
        resume: tuple[Any, float, Exception | None] | None = None,
    ) -> asyncio.Future[None]:
        """Queue an operation for the driver task; returns its future.

        `resume`: the fast path started it (its request, start time and
        failure), so it goes first in line and the driver task starts now.
        """
        operation = _Operation(seq, kind, _new_future(), start, before, after, offload)
        if resume is not None:
            self._queue.appendleft(operation)
            self._start_driver(resume)
        else:
            self._queue.append(operation)
            if not self._busy:
                self._start_driver()
        return operation.future

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
                if self.broken is not None:
                    error: BaseException | None = self._unusable()
                elif resume is not None:
                    error = await self._run(operation, *resume)
                else:
                    self._current = operation.seq
                    error = await self._run(operation)
                resume = None
                queued.popleft()
                settle(operation.future, error)
        except asyncio.CancelledError:  # the loop is shutting down mid-operation
            if self.broken is None and queued:
                self.broken = RankFailedError(
                    f"MPI {queued[0].name} on rank {self.rank} was cancelled in flight "
                    "(its event loop stopped)",
                    operation=queued[0].name,
                )
            while queued:
                settle(queued.popleft().future, self._unusable())
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
        error for its caller, if any (and then the driver is broken)."""
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
            worker = self._worker = MpiThread(f"atomr-mpi-rank{self.rank}")
            worker.start()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        worker.jobs.put((fn, loop, future))
        return future

    # -- waiting ----------------------------------------------------------------------

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

    # -- failures -----------------------------------------------------------------------

    def _unusable(self) -> RankFailedError:
        assert self.broken is not None
        return RankFailedError(
            f"collective unusable after an earlier failure: {self.broken}",
            ranks=self.broken.ranks,
            operation=self.broken.operation,
        )

    def _fail(
        self, operation: _Operation, others: dict[int, int | None] | None, what: str
    ) -> RankFailedError:
        """The error for a failed operation; marks the driver broken."""
        where = f"MPI {operation.name} on rank {self.rank} of {self.world_size} {what}"
        detail = describe_missing(others)
        cls = CollectiveTimeoutError if what.startswith("timed out") else RankFailedError
        error = cls(f"{where}: {detail}", ranks=list(others or ()), operation=operation.name)
        if self.broken is None:
            self.broken = error
        return error


def _new_future() -> asyncio.Future[None]:
    return asyncio.get_running_loop().create_future()
