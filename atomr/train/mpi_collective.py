"""`MpiCollective`: the `Collective` interface across the processes of an MPI job.

Every operation is one MPI call on raw numeric buffers (mpi4py's uppercase,
buffer API; nothing is pickled): `all_reduce` is `Allreduce(MPI.IN_PLACE,
buf, MPI.SUM)` on the caller's flat float32/float64 array, `broadcast` is
`Bcast`, `barrier` is `Barrier`. The calls run on one dedicated worker thread
per collective, in submission order (MPI requires the same order of
collectives on every rank), so the event loop and the actors on it keep
working while a collective is in flight.

Cost. The hot path of an operation is one hand-off to the MPI thread (a
queue put), the MPI call, and one `call_soon_threadsafe` back to the loop:
no extra messages, no copies (`MPI.IN_PLACE` on the caller's array), no
per-operation timer (one watchdog timer per collective runs every
`min(0.2 s, timeout / 4)` while operations are pending).

Failure detection costs nothing until something is slow. When an operation
has not completed `timeout` seconds after it began on the MPI thread, the
rank sends every other rank a *note* (the number of the operation its MPI
thread is in: one int64, `Isend` on a private duplicate of the
communicator) and waits up to `min(max(timeout, 1 s), 5 s)` for theirs. A
live rank inside a collective answers from its watchdog (within 0.2 s); a
rank that is dead, or stuck outside the collectives, never does. The call
then raises `CollectiveTimeoutError` naming the ranks that did not answer
for this operation (with the operation a rank is at when it answered for
another one: out of step). An error reported by MPI itself raises
`RankFailedError`, after the same exchange. After either, the collective is
broken (its worker thread may be stuck inside MPI for good): operations
queued behind the failed one and later calls raise at once, and the program
should report the error and call `abort()`, which ends the whole job through
`MPI_Abort`. The notes are exchanged from the event loop's thread while the
MPI thread is blocked, which needs `MPI_THREAD_MULTIPLE` (the `mpich` wheel
gives it); with less, the timeout still fires but cannot name the rank.

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
_NOTE_TAG = 7
_POLL_S = 0.2  # a long operation looks for peers' notes this often
_GRACE_S = 5.0  # the longest a failed rank waits for the others' notes
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
    """One collective: its number, and its state as seen by the MPI thread."""

    __slots__ = ("error", "finished", "future", "kind", "seq", "skip", "started")

    def __init__(self, seq: int, kind: str, future: asyncio.Future[Any]) -> None:
        self.seq = seq
        self.kind = kind
        self.future = future  # awaited on the loop; settled by `_settle`
        self.started: float | None = None  # set by the MPI thread when it begins
        self.finished = False  # set by the MPI thread when the MPI call returned
        self.error: BaseException | None = None
        self.skip = False  # set when an earlier operation broke the collective

    @property
    def name(self) -> str:
        return f"{self.kind} #{self.seq}"


class _Worker(threading.Thread):
    """The dedicated MPI thread: runs submitted calls one at a time, in order,
    and wakes the awaiting coroutine with one `call_soon_threadsafe`.

    A daemon thread, so a call stuck in MPI (a dead peer) never keeps the
    interpreter from exiting.
    """

    def __init__(self, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.jobs: queue.SimpleQueue[
            tuple[_Operation, Callable[[], Any], asyncio.AbstractEventLoop] | None
        ] = queue.SimpleQueue()
        self.running: _Operation | None = None  # the operation inside MPI now

    def run(self) -> None:
        monotonic = time.monotonic
        while True:
            job = self.jobs.get()
            if job is None:
                return
            operation, fn, loop = job
            if operation.skip:  # the collective broke before this one began
                continue
            self.running = operation
            operation.started = monotonic()
            try:
                fn()
            except BaseException as exc:  # handed to the awaiting coroutine
                operation.error = exc
            operation.finished = True
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting
                loop.call_soon_threadsafe(_settle, operation)


def _settle(operation: _Operation) -> None:
    future = operation.future
    if future.done():
        return
    if operation.error is not None:
        future.set_exception(operation.error)
    else:
        future.set_result(None)


class _DeadlinePassed(Exception):
    """Internal: an operation ran past the collective's timeout."""


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
        # Naming a missing rank exchanges notes from the event loop's thread
        # while the MPI thread is blocked: only legal with MULTIPLE.
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
        # how often a long operation looks for peers' notes, and how long a
        # rank that ran past its timeout waits for the others' notes
        self._poll_s = _POLL_S if timeout is None else min(_POLL_S, timeout / 4)
        self._grace_s = _GRACE_S if timeout is None else min(max(timeout, 1.0), _GRACE_S)
        # failure notes, on the loop's thread only (see _poll_notes)
        self._peers = [r for r in range(self.world_size) if r != self.rank]
        self._note_recvs: list[tuple[int, Any, np.ndarray]] | None = None
        self._note_sends: list[tuple[Any, np.ndarray]] = []
        self._notes: dict[int, int] = {}  # peer -> the operation its last note named
        self._sent: dict[int, int] = {}  # peer -> the operation our last note to it named
        # operations submitted and not yet returned; one watchdog timer for all
        self._pending: dict[int, _Operation] = {}
        self._watchdog: asyncio.TimerHandle | None = None
        self._watchdog_loop: asyncio.AbstractEventLoop | None = None

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
        recvs, self._note_recvs = self._note_recvs, None
        if recvs and self._broken is None:
            for _, req, _ in recvs:  # no note came: withdraw the standing receives
                try:
                    req.Cancel()
                    req.Wait()
                except self._mpi.Exception:
                    pass

    # -- machinery ------------------------------------------------------------------
    #
    # The hot path is one hand-off to the MPI thread (a queue put), the MPI
    # call, and one `call_soon_threadsafe` back. One watchdog timer per
    # collective (re-armed every `_poll_s` while operations are pending, not
    # per operation) enforces the deadline of the operation on the MPI thread;
    # once that operation has run `_poll_s`, the watchdog also collects and
    # answers peers' notes. Past its deadline, a rank sends every peer a note
    # (an int64: the number of the operation its MPI thread is in, `Isend` on
    # a private duplicate of the communicator) and waits up to `_grace_s` for
    # theirs. A live rank inside a collective answers at its next watch; a
    # rank that is dead, or stuck outside the collectives, never does, and is
    # named.

    async def _submit(self, kind: str, call: Callable[[], Any]) -> None:
        if self._broken is not None:
            raise self._unusable()
        self._seq += 1
        loop = asyncio.get_running_loop()
        operation = _Operation(self._seq, kind, loop.create_future())
        worker = self._worker
        if worker is None:
            worker = self._worker = _Worker(f"atomr-mpi-rank{self.rank}")
            worker.start()
        worker.jobs.put((operation, call, loop))
        pending = self._pending
        pending[operation.seq] = operation
        if self._watchdog is None or self._watchdog_loop is not loop:
            self._watchdog_loop = loop
            self._watchdog = loop.call_later(self._poll_s, self._watch)
        try:
            await operation.future
        except _DeadlinePassed:
            missing = await self._gather_notes(operation, stop_when_finished=True)
            if not operation.finished:
                raise self._fail(
                    operation, missing, f"timed out after {self.timeout:g} s"
                ) from None
            if operation.error is None:  # completed during the diagnosis
                return
            missing = await self._gather_notes(operation)
            raise self._fail(operation, missing, f"MPI error: {operation.error}") from None
        except self._mpi.Exception as exc:
            missing = await self._gather_notes(operation)
            raise self._fail(operation, missing, f"MPI error: {exc}") from exc
        finally:
            del pending[operation.seq]

    def _watch(self) -> None:
        """The watchdog (on the loop, every `_poll_s` while an operation is
        pending): answer peers' notes, enforce the running operation's deadline."""
        self._watchdog = None
        if not self._pending:
            return  # idle: the next operation re-arms it
        delay = self._poll_s
        worker, timeout = self._worker, self.timeout
        running = worker.running if worker is not None else None
        if running is not None and running.started is not None and not running.finished:
            ran = time.monotonic() - running.started
            if ran >= self._poll_s or self._notes:  # only long operations talk to peers
                self._poll_notes()
            if timeout is not None and not running.future.done():
                if ran >= timeout:
                    running.future.set_exception(_DeadlinePassed())
                else:
                    delay = min(delay, timeout - ran)
        assert self._watchdog_loop is not None
        self._watchdog = self._watchdog_loop.call_later(delay, self._watch)

    def _unusable(self) -> RankFailedError:
        assert self._broken is not None
        return RankFailedError(
            f"collective unusable after an earlier failure: {self._broken}",
            ranks=self._broken.ranks,
            operation=self._broken.operation,
        )

    def _state(self) -> int:
        """The operation this rank's MPI thread is in (or last finished)."""
        worker = self._worker
        running = worker.running if worker is not None else None
        return running.seq if running is not None else 0

    def _poll_notes(self) -> None:
        """On the loop's thread: collect peers' notes; answer a peer that sent
        one with this rank's state (again whenever the state has moved)."""
        if not self._can_diagnose or self.world_size == 1:
            return
        mpi = self._mpi
        if self._note_recvs is None:
            self._note_recvs = [self._post_note_recv(p) for p in self._peers]
        for k, (peer, req, buf) in enumerate(self._note_recvs):
            try:
                arrived = req.Test()
            except mpi.Exception:
                continue
            if arrived:
                self._notes[peer] = int(buf[0])
                self._note_recvs[k] = self._post_note_recv(peer)
        state = self._state()
        for peer in self._notes:
            if self._sent.get(peer) != state:
                self._send_note(peer, state)
        self._note_sends = [(r, b) for r, b in self._note_sends if not _test(r, mpi)]

    def _post_note_recv(self, peer: int) -> tuple[int, Any, np.ndarray]:
        buf = np.zeros(1, dtype=np.int64)
        req = self._ctl.Irecv([buf, self._mpi.INT64_T], source=peer, tag=_NOTE_TAG)
        return peer, req, buf

    def _send_note(self, peer: int, seq: int) -> None:
        buf = np.array([seq], dtype=np.int64)
        self._sent[peer] = seq
        try:
            req = self._ctl.Isend([buf, self._mpi.INT64_T], dest=peer, tag=_NOTE_TAG)
        except self._mpi.Exception:  # a dead peer: it will be named anyway
            return
        self._note_sends.append((req, buf))

    async def _gather_notes(
        self, operation: _Operation, *, stop_when_finished: bool = False
    ) -> dict[int, int | None] | None:
        """After a failure: send every peer a note, wait up to `_grace_s` for
        theirs. Returns {peer: the operation its note named, or None when no
        note came} for the peers not in `operation`; None when this MPI
        cannot tell (no THREAD_MULTIPLE)."""
        if not self._can_diagnose:
            return None
        if self.world_size == 1:
            return {}
        state = self._state()
        for peer in self._peers:
            if self._sent.get(peer) != state:
                self._send_note(peer, state)
        end = time.monotonic() + self._grace_s
        while True:
            self._poll_notes()
            if stop_when_finished and operation.finished:
                break
            if all(self._notes.get(p) == operation.seq for p in self._peers):
                break
            if time.monotonic() >= end:
                break
            await asyncio.sleep(0.005)
        return {p: self._notes.get(p) for p in self._peers if self._notes.get(p) != operation.seq}

    def _fail(
        self, operation: _Operation, others: dict[int, int | None] | None, what: str
    ) -> RankFailedError:
        """The error for a failed operation; marks the collective broken."""
        where = f"MPI {operation.name} on rank {self.rank} of {self.world_size} {what}"
        if others is None:
            detail = "could not tell which rank is missing (MPI lacks THREAD_MULTIPLE)"
        elif not others:
            detail = "every rank had joined; a rank failed during the operation"
        else:
            names = ", ".join(str(r) for r in others)
            word = "rank" if len(others) == 1 else "ranks"
            detail = f"{word} {names} never joined (dead, stuck or out of step)"
            seen = [f"rank {p} is at operation #{v}" for p, v in others.items() if v is not None]
            if seen:
                detail += f"; {', '.join(seen)}"
        cls = CollectiveTimeoutError if what.startswith("timed out") else RankFailedError
        error = cls(f"{where}: {detail}", ranks=list(others or ()), operation=operation.name)
        if self._broken is None:
            self._broken = error
            # operations queued behind this one will never run: fail them now
            for other in self._pending.values():
                if other is not operation and not other.started:
                    other.skip = True
                    if not other.future.done():
                        other.future.set_exception(self._unusable())
        return error


def _test(req: Any, mpi: Any) -> bool:
    try:
        return bool(req.Test())
    except mpi.Exception:
        return True


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
