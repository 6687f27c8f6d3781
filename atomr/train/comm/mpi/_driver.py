"""`OperationDriver`: how `MpiCollective` runs its non-blocking MPI calls
without blocking the event loop, one at a time, and fails loudly.

Operations run in submission order (MPI requires it; a cancelled caller
leaves its operation running), and never block the event loop.

Cost. An operation submitted while the driver is idle is started by its
caller, on the loop's thread, and tested there (each test also advances
MPI's progress engine) for up to 10 ms: no task, no thread hand-off, no
copies, no timer. Tests run in bursts with a yield to the loop between them:
0.1 ms while other work is waiting on the loop, growing to 1 ms while it is
idle (a yield stalls the collective on every rank for a moment), so the loop
is held about 1 ms at most at a time (one test can run past a burst's end).
An operation still running after that (a large buffer, or a late peer) is
*parked*: the driver's MPI thread blocks in `Wait` on it (holding neither
the GIL nor the loop; without `MPI_THREAD_MULTIPLE` it tests it and the
peers' notes in turn instead: `FailureNotes.wait_watching`) and wakes the
loop once when it completes. Operations submitted meanwhile queue behind it,
run in order by one driver task. Local numpy work before and after the MPI
call runs on the loop below 1 MiB and on the MPI thread above.

Failure detection costs nothing until something is slow. When an operation
has not completed `timeout` seconds after it started, the rank asks its
peers where they are (`FailureNotes`, in `_notes.py`) and raises
`CollectiveTimeoutError` naming the ranks that never joined. An error
reported by MPI itself raises `RankFailedError`, after the same exchange.
Ranks whose checks disagree raise `CollectiveMismatchError` (every rank saw
every rank's signature). After any of these, the driver is broken (its MPI
thread may be stuck inside MPI for good): operations queued behind the
failed one and later calls raise at once.

Its life, for one operation: the operation check (`_order.py`, waited for
like the operation; off with `check_order=False` and in a world of one),
local work before, the non-blocking MPI call, tests from the loop for up to
`_SPIN_S` (`Spinner`, `_operation.py`), parked on the MPI thread (`_park`:
only a parked operation times out, or sees peers' notes, every `_poll_s`),
local work after. `submit` runs the first steps itself when the driver is
idle (the fast path, `_fast`), and a driver task (`_drive`) the rest.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any

from atomr.train.comm.mpi._notes import LEFT, FailureNotes, failure_error, unusable_error
from atomr.train.comm.mpi._operation import Operation, Resume, Spinner, new_future
from atomr.train.comm.mpi._order import OrderCheck, Signature
from atomr.train.comm.mpi._worker import LazyMpiThread, settle
from atomr.train.comm.mpi.errors import CollectiveError, CollectiveMismatchError, RankFailedError

__all__ = ["OperationDriver"]

_POLL_S = 0.2  # a parked operation looks for peers' notes this often
_SPIN_S = 0.010  # test a started operation from the loop this long before parking it


class OperationDriver:
    """Runs one rank's MPI operations in order, off the loop's critical path,
    each within `timeout` (see the module docstring).

    Args:
        mpi: the `mpi4py.MPI` module.
        rank, world_size: this rank's place in the communicator.
        timeout: seconds an operation may take from the moment it starts,
            or None to wait forever.
        notes: the failure-note exchange with the peers.
        check: the operation check (`_order.py`) run before every
            operation's MPI call, or None for none.
    """

    def __init__(
        self,
        mpi: Any,
        rank: int,
        world_size: int,
        timeout: float | None,
        notes: FailureNotes,
        check: OrderCheck | None = None,
    ) -> None:
        self._mpi = mpi
        self.rank = rank
        self.world_size = world_size
        self.timeout = timeout
        self._notes = notes
        self._check = check
        self._seq = 0  # the number of the last operation submitted
        self._current = 0  # the number of the operation the driver is in (or last ran)
        self.completed = 0  # the number of the last operation completed here
        self.broken: RankFailedError | CollectiveMismatchError | None = None
        """The error of the operation that failed; every later one raises."""
        self.worker = LazyMpiThread(f"atomr-mpi-rank{rank}")
        """The MPI thread (`_worker.py`): parked waits, heavy local work."""
        # operations submitted and not yet finished, in order; one driver task runs them
        self._queue: deque[Operation] = deque()
        self._driver: asyncio.Task[None] | None = None
        self._busy = False  # an operation is in flight (the fast path's or the driver's)
        # how often a parked operation looks for peers' notes
        self._poll_s = _POLL_S if timeout is None else min(_POLL_S, timeout / 4)
        self._spinner = Spinner(min(_SPIN_S, self._poll_s))

    async def submit(
        self,
        kind: str,
        start: Callable[[Any], Any],
        arg: Any,
        before: Callable[[], None] | None = None,
        after: Callable[[], None] | None = None,
        offload: bool = False,
        *,
        signature: Signature,
    ) -> None:
        """Run one operation: the operation check (when the driver has one),
        `before()`, `start(arg)` (the non-blocking MPI call; returns its
        request, or None when there is nothing to wait for), its completion,
        then `after()`. A cancelled caller leaves the operation running.

        Args:
            kind: the operation's name in errors, one of `_order.KINDS`.
            offload: run `before` / `after` on the MPI thread.
            signature: the operation's count, dtype code, root and purpose
                (`_order.signature_of`), compared across the ranks.

        Raises:
            CollectiveMismatchError: the ranks are at different operations
                (none ran it; the driver is broken).
            CollectiveTimeoutError: not complete within `timeout`.
            RankFailedError: MPI or the local work failed, or an earlier
                operation did (the driver is broken).
        """
        if self.broken is not None:
            raise self._unusable()
        self._seq += 1
        seq = self._seq
        if self._busy or offload:  # behind other operations, or heavy local work
            job = partial(start, arg)
            await self._enqueue(seq, kind, signature, job, before, after, offload)
            return
        await self._fast(seq, kind, signature, start, arg, before, after)

    async def _fast(
        self,
        seq: int,
        kind: str,
        signature: Signature,
        start: Callable[[Any], Any],
        arg: Any,
        before: Callable[[], None] | None,
        after: Callable[[], None] | None,
    ) -> None:
        """The fast path of `submit` (module docstring): no task, no future,
        no hand-off (on a 1 MB buffer every object touched here costs cache
        misses). An operation still running after the spin, or a failure,
        goes to a driver task."""
        self._busy = True
        self._current = seq
        started = time.monotonic()
        request: Any = None
        checking = True  # the request in flight (if any) is the check's
        failure: Exception | None = None  # None: still running after the spin
        try:
            check = self._check
            if check is not None:
                request = check.start(seq, kind, signature)
                if not await self._spinner.spin(request):
                    raise _Unfinished
                self._verify(check)
            checking = False
            if before is not None:
                before()
            request = start(arg)
            if request is None or await self._spinner.spin(request):
                if after is not None:
                    after()
                self._busy, self.completed = False, seq
                if self._queue:  # submitted while this one was in flight
                    self._start_driver()
                return
        except asyncio.CancelledError:  # the operation goes on without its caller
            resume: Resume = (request, started, None, checking)
            self._enqueue(seq, kind, signature, partial(start, arg), before, after, resume=resume)
            raise
        except _Unfinished:
            pass
        except Exception as exc:
            failure = exc
        resume = (request, started, failure, checking)
        await self._enqueue(seq, kind, signature, partial(start, arg), before, after, resume=resume)

    def close(self) -> None:
        """Stop the MPI thread once its current call is done (a later
        operation starts a new one)."""
        self.worker.close()

    # -- the driver task ------------------------------------------------------------

    def _enqueue(
        self,
        seq: int,
        kind: str,
        signature: Signature,
        start: Callable[[], Any],
        before: Callable[[], None] | None,
        after: Callable[[], None] | None,
        offload: bool = False,
        resume: Resume | None = None,
    ) -> asyncio.Future[None]:
        """Queue an operation for the driver task; returns its future.

        `resume`: the fast path began it (see `Resume`), so it goes first in
        line and the driver task starts now.
        """
        operation = Operation(seq, kind, signature, new_future(), start, before, after, offload)
        if resume is not None:
            self._queue.appendleft(operation)
            self._start_driver(resume)
        else:
            self._queue.append(operation)
            if not self._busy:
                self._start_driver()
        return operation.future

    def _start_driver(self, resume: Resume | None = None) -> None:
        self._busy = True
        self._driver = asyncio.get_running_loop().create_task(
            self._drive(resume), name=f"atomr-mpi-rank{self.rank}"
        )

    async def _drive(self, resume: Resume | None = None) -> None:
        """Run the queued operations one at a time, in submission order
        (`resume`: the first one was started by the fast path)."""
        queued = self._queue
        try:
            while queued:
                operation = queued[0]
                if resume is not None:  # its failure (if any) broke the driver
                    error: CollectiveError | None = await self._run(operation, *resume)
                elif self.broken is not None:
                    error = self._unusable()
                else:
                    self._current = operation.seq
                    error = await self._run(operation)
                resume, self.completed = None, self.completed if error else operation.seq
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
        operation: Operation,
        request: Any = None,
        started: float | None = None,
        failure: Exception | None = None,
        checking: bool = True,
    ) -> CollectiveError | None:
        """Run one operation, or resume one the fast path began (`request`
        in flight since `started`, the check's if `checking`; or `failure`
        raised). Returns the error for its caller, if any (and then the
        driver is broken)."""
        try:
            if failure is not None:
                raise failure  # reported below like any failure here
            if started is None:
                started = time.monotonic()
                if self._check is not None:
                    request = self._check.start(operation.seq, operation.kind, operation.signature)
                    if await self._spinner.spin(request):
                        request = None
            if checking:  # the check (if any) is in flight or done; the call not begun
                if request is not None:
                    await self._park_check(operation, request, started)
                if self._check is not None:
                    self._verify(self._check)
                request = await self._begin(operation)
            if request is not None:
                await self._park(operation, request, started)
            if operation.after is not None:
                await self._local(operation.after, operation.offload)
        except CollectiveError as exc:
            return exc
        except self._mpi.Exception as exc:
            missing = await self._notes.gather(operation.seq, self._current)
            return self._fail(operation, missing, f"MPI error: {exc}")
        except Exception as exc:  # local work failed: this rank is out of step now
            return self._fail(operation, {}, f"failed on this rank: {exc!r}")
        return None

    async def _begin(self, operation: Operation) -> Any:
        """`before`, then start the MPI call and spin on it; returns its
        request while it is still running, else None."""
        if operation.before is not None:
            await self._local(operation.before, operation.offload)
        request = operation.start()
        if request is not None and await self._spinner.spin(request):
            return None
        return request

    async def _park_check(self, operation: Operation, request: Any, started: float) -> None:
        """Park the check's `request`. When the loop stops meanwhile (this
        task is cancelled), the MPI thread runs the rest of the operation,
        as it finishes a parked operation, so the peers are not left waiting."""
        try:
            await self._park(operation, request, started)
        except asyncio.CancelledError:
            self.worker.run(partial(self._finish_off_loop, operation))
            raise

    def _finish_off_loop(self, operation: Operation) -> None:
        """On the MPI thread, once the check's `Wait` returned: the rest of
        an operation whose loop stopped (nothing when the ranks disagree)."""
        assert self._check is not None
        if self._check.mismatch() is not None:
            return
        if operation.before is not None:
            operation.before()
        request = operation.start()
        if request is not None:
            request.Wait()
        if operation.after is not None:
            operation.after()

    def _verify(self, check: OrderCheck) -> None:
        """After the check's exchange: raise (and break the driver) when the
        ranks are at different operations."""
        error = check.mismatch()
        if error is not None:
            if self.broken is None:
                self.broken = error
            raise error

    async def _local(self, fn: Callable[[], None], offload: bool) -> None:
        if offload:
            await self.worker.run(fn)
        else:
            fn()

    # -- waiting ----------------------------------------------------------------------

    async def _park(self, operation: Operation, request: Any, started: float) -> None:
        """Wait for `request` on the MPI thread, enforcing the deadline and
        answering peers' notes meanwhile."""
        timeout = self.timeout  # the MPI thread's wait ends 1 s after the loop gave up
        end = None if timeout is None else started + timeout + 1.0
        done = self.worker.run(self._notes.waiter(request, end, operation.seq))
        while True:
            wait = self._poll_s
            if timeout is not None:
                wait = min(wait, max(0.0, started + timeout - time.monotonic()))
            await asyncio.wait((done,), timeout=wait)
            # done, unless `PeersLeft`: the MPI thread saw a peer's LEFT note
            if done.done() and (done.exception() is None or not self._notes.left(operation.seq)):
                done.result()  # an MPI error is raised here
                return
            self._notes.poll(self._current)
            if left := self._notes.left(operation.seq):  # they failed on their own before it
                raise self._fail(operation, {p: LEFT for p in left}, "could not complete")
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
        return unusable_error(self.broken)

    def _fail(
        self, operation: Operation, others: dict[int, int | None] | None, what: str
    ) -> RankFailedError:
        """The error for a failed operation; marks the driver broken."""
        error = failure_error(operation.name, self.rank, self.world_size, others, what)
        if self.broken is None:
            self.broken = error
        return error


class _Unfinished(Exception):
    """The fast path's check outlived its spin: the driver task hands over."""
