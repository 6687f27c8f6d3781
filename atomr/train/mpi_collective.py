"""`MpiCollective`: the `Collective` interface across the processes of an MPI job.

Every operation is one MPI call on raw numeric buffers (mpi4py's uppercase,
buffer API; nothing is pickled): `all_reduce` is `Allreduce(MPI.IN_PLACE,
buf, MPI.SUM)` on the caller's flat float32/float64 array, `broadcast` is
`Bcast`, `barrier` is `Barrier`. The calls run on one dedicated worker thread
per collective, in submission order (MPI requires the same order of
collectives on every rank), so the event loop and the actors on it keep
working while a collective is in flight.

Failure detection. Before each operation a rank posts a tiny *arrival note*
(its operation number, an int64, `Isend`) to every other rank on a private
duplicate of the communicator, and receives theirs (`Irecv`). If the
operation does not complete within `timeout` seconds, the notes that never
came name the ranks that did not join (dead, stuck or diverged): the call
raises `CollectiveTimeoutError` naming them. An error reported by MPI itself
raises `RankFailedError`, also naming the silent ranks. After either, the
collective is broken (its worker thread may be stuck inside MPI for good):
later calls raise at once, and the program should report the error and call
`abort()`, which ends the whole job through `MPI_Abort`.

mpi4py is imported when the first `MpiCollective` is made, not when this
module is imported; without it the constructor raises an `ImportError` that
names the `atomr[mpi]` extra.
"""

from __future__ import annotations

import asyncio
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import numpy as np

from atomr.train.collective import Collective

__all__ = [
    "CollectiveError",
    "CollectiveTimeoutError",
    "MpiCollective",
    "RankFailedError",
    "import_mpi",
]

_OPS = ("sum", "mean")
_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


class CollectiveError(RuntimeError):
    """A collective across processes failed; the group can no longer be used."""


class RankFailedError(CollectiveError):
    """A collective failed because one or more ranks did not take part.

    Attributes:
        ranks: the ranks that never joined the failed operation (empty when
            every rank had joined and the operation failed inside MPI).
        operation: what failed, e.g. "all_reduce #12".
    """

    def __init__(self, message: str, ranks: Sequence[int] = (), operation: str = "") -> None:
        super().__init__(message)
        self.ranks = tuple(ranks)
        self.operation = operation


class CollectiveTimeoutError(RankFailedError, TimeoutError):
    """A collective did not complete within the collective's timeout; `ranks`
    names the ranks that never joined it."""


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
    """One collective in flight: its arrival notes and completion state."""

    def __init__(self, seq: int, name: str) -> None:
        self.seq = seq
        self.name = name
        self.lock = threading.Lock()
        self.started: float | None = None
        self.finished = False
        self.peers: list[int] = []
        self.recv_reqs: list[Any] = []
        self.send_reqs: list[Any] = []
        self.recv_bufs: np.ndarray | None = None
        self.send_buf: np.ndarray | None = None

    def missing(self) -> list[int] | None:
        """Ranks whose arrival note has not come (None: cannot tell yet)."""
        with self.lock:
            if self.started is None:
                return None
            return [
                peer for peer, req in zip(self.peers, self.recv_reqs, strict=True) if not req.Test()
            ]


class _Worker(threading.Thread):
    """The dedicated MPI thread: runs submitted calls one at a time, in order.

    A daemon thread, so a call stuck in MPI (a dead peer) never keeps the
    interpreter from exiting.
    """

    def __init__(self, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.jobs: queue.SimpleQueue[
            tuple[Callable[[], Any], asyncio.AbstractEventLoop, asyncio.Future[Any]] | None
        ] = queue.SimpleQueue()

    def run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            fn, loop, future = job
            try:
                result = fn()
            except BaseException as exc:  # handed to the awaiting coroutine
                loop.call_soon_threadsafe(_settle, future, None, exc)
            else:
                loop.call_soon_threadsafe(_settle, future, result, None)


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class MpiCollective(Collective):
    """`all_reduce`, `broadcast` and `barrier` across the processes of an MPI job.

    Every rank of the communicator must create its `MpiCollective` at the
    same point of the program (the constructor duplicates the communicator,
    a collective call) and then issue the same operations in the same order.

    Args:
        comm: an mpi4py communicator (default: `MPI.COMM_WORLD`).
        timeout: seconds an operation may take, from the moment it starts on
            the MPI thread, before it fails with `CollectiveTimeoutError`
            naming the ranks that never joined; None waits forever.

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
        # Diagnosing a stuck operation tests its arrival notes from the event
        # loop's thread while the MPI thread is blocked: only legal with MULTIPLE.
        self._can_diagnose = level >= mpi.THREAD_MULTIPLE
        base = mpi.COMM_WORLD if comm is None else comm
        self._comm = base.Dup()
        self._ctl = base.Dup()
        for c in (self._comm, self._ctl):
            c.Set_errhandler(mpi.ERRORS_RETURN)
        self.rank: int = self._comm.Get_rank()
        self.world_size: int = self._comm.Get_size()
        self.timeout = timeout
        self._seq = 0
        self._broken: RankFailedError | None = None
        self._worker: _Worker | None = None

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
        `Allreduce(MPI.IN_PLACE)` sums `buffers[0]` across the ranks. Every
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
        count = self.world_size * len(bufs)
        mpi = self._mpi

        def call() -> None:
            for extra in bufs[1:]:
                np.add(target, extra, out=target)
            if self.world_size > 1:
                self._comm.Allreduce(mpi.IN_PLACE, target, op=mpi.SUM)
            if op == "mean":
                np.divide(target, target.dtype.type(count), out=target)

        await self._submit("all_reduce", call)
        return target

    async def broadcast(self, buffers: Sequence[Any] | np.ndarray, root: int = 0) -> None:
        """Copy rank `root`'s `buffers[0]` into every buffer of every rank.

        Args:
            buffers: this process's buffers (an array or a list of arrays of
                one shape and dtype; the same shape and dtype on every rank).
            root: the rank whose `buffers[0]` is copied.

        Raises:
            IndexError: `root` is not a rank of the communicator.
            TypeError, ValueError: as `all_reduce`.
            CollectiveTimeoutError, RankFailedError: as `all_reduce`.
        """
        if isinstance(root, bool) or not isinstance(root, int) or not 0 <= root < self.world_size:
            raise IndexError(f"root {root!r} is not a rank of this {self.world_size}-rank group")
        bufs = _check(buffers)

        def call() -> None:
            if self.world_size > 1:
                self._comm.Bcast(bufs[0], root=root)
            for other in bufs[1:]:
                np.copyto(other, bufs[0])

        await self._submit("broadcast", call)

    async def barrier(self) -> None:
        """Return once every rank has reached the barrier (`MPI_Barrier`).

        Raises:
            CollectiveTimeoutError, RankFailedError: as `all_reduce`.
        """
        await self._submit("barrier", self._comm.Barrier)

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
        """Stop the MPI thread once queued operations are done (a later
        operation starts a new one). Does nothing to the communicator."""
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.jobs.put(None)

    # -- machinery ------------------------------------------------------------------

    def _start_notes(self, operation: _Operation) -> None:
        """On the MPI thread: post this rank's arrival notes for `operation`."""
        mpi = self._mpi
        peers = [r for r in range(self.world_size) if r != self.rank]
        with operation.lock:
            operation.peers = peers
            operation.send_buf = np.array([operation.seq], dtype=np.int64)
            operation.recv_bufs = np.zeros(len(peers), dtype=np.int64)
            operation.send_reqs = [
                self._ctl.Isend([operation.send_buf, mpi.INT64_T], dest=p, tag=0) for p in peers
            ]
            operation.recv_reqs = [
                self._ctl.Irecv([operation.recv_bufs[k : k + 1], mpi.INT64_T], source=p, tag=0)
                for k, p in enumerate(peers)
            ]
            operation.started = time.monotonic()

    def _finish_notes(self, operation: _Operation) -> None:
        """On the MPI thread: the operation is complete; settle its notes."""
        with operation.lock:
            self._mpi.Request.Waitall(operation.recv_reqs + operation.send_reqs)
            operation.finished = True
        assert operation.recv_bufs is not None
        bad = [
            (p, int(v))
            for p, v in zip(operation.peers, operation.recv_bufs, strict=True)
            if v != operation.seq
        ]
        if bad:
            raise RankFailedError(
                f"{operation.name}: ranks diverged (rank {self.rank} is at operation "
                f"{operation.seq}, {', '.join(f'rank {p} at {v}' for p, v in bad)})",
                ranks=[p for p, _ in bad],
                operation=operation.name,
            )

    async def _submit(self, kind: str, call: Callable[[], Any]) -> None:
        if self._broken is not None:
            raise RankFailedError(
                f"collective unusable after an earlier failure: {self._broken}",
                ranks=self._broken.ranks,
                operation=self._broken.operation,
            )
        self._seq += 1
        operation = _Operation(self._seq, f"{kind} #{self._seq}")
        mpi = self._mpi

        def job() -> None:
            try:
                if self.world_size > 1:
                    self._start_notes(operation)
                else:
                    operation.started = time.monotonic()
                call()
                if self.world_size > 1:
                    self._finish_notes(operation)
            except mpi.Exception as exc:
                missing = operation.missing() or []
                raise self._failure(operation, missing, f"MPI error: {exc}") from exc

        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        if self._worker is None:
            self._worker = _Worker(f"atomr-mpi-rank{self.rank}")
            self._worker.start()
        self._worker.jobs.put((job, loop, future))
        try:
            await self._wait(operation, future)
        except RankFailedError as exc:
            if self._broken is None:
                self._broken = exc
            raise

    async def _wait(self, operation: _Operation, future: asyncio.Future[Any]) -> None:
        """Await `future`; a timer (no per-operation task) enforces the timeout."""
        if self.timeout is None:
            await future
            return
        loop = asyncio.get_running_loop()
        timeout = self.timeout
        handle: asyncio.TimerHandle | None = None

        def check() -> None:
            nonlocal handle
            if future.done():
                return
            started = operation.started
            if started is None:  # an earlier operation still holds the MPI thread
                handle = loop.call_later(min(timeout, 0.05), check)
                return
            remaining = started + timeout - time.monotonic()
            if remaining > 0:
                handle = loop.call_later(remaining, check)
                return
            missing = operation.missing() if self._can_diagnose else None
            with operation.lock:
                if operation.finished:  # completed just now; its result is on the way
                    return
            future.set_exception(
                self._failure(operation, missing, f"timed out after {timeout:g} s")
            )

        handle = loop.call_later(timeout, check)
        try:
            await future
        finally:
            if handle is not None:
                handle.cancel()

    def _failure(
        self, operation: _Operation, missing: list[int] | None, what: str
    ) -> RankFailedError:
        where = f"MPI {operation.name} on rank {self.rank} of {self.world_size} {what}"
        if missing:
            names = ", ".join(str(r) for r in missing)
            word = "rank" if len(missing) == 1 else "ranks"
            detail = f"{word} {names} never joined (dead, stuck or out of step)"
        elif missing is None:
            detail = "could not tell which rank is missing (MPI lacks THREAD_MULTIPLE)"
        else:
            detail = "every rank had joined; a rank failed during the operation"
        cls = CollectiveTimeoutError if what.startswith("timed out") else RankFailedError
        return cls(f"{where}: {detail}", ranks=missing or (), operation=operation.name)


def _check(buffers: Sequence[Any] | np.ndarray) -> list[np.ndarray]:
    """Validate this process's buffers; returns them as a list."""
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
