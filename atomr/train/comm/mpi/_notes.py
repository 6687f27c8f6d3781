"""Failure notes: how a rank whose collective ran past its timeout finds out
which ranks never joined it.

Nothing is sent while collectives complete. A rank whose operation is late
sends every peer a *note* (one int64: the number of the operation it is in,
`Isend` on a private duplicate of the communicator) and waits a bounded time
for theirs. A live rank inside a collective that has been waiting a while
answers (`poll`, every 0.2 s); a rank that is dead, or stuck outside the
collectives, never does, and is named. The exchange runs on the event loop's
thread while the collective's own MPI call may be blocked on another thread,
which needs `MPI_THREAD_MULTIPLE`; with less, nothing is exchanged and the
failure cannot name the rank.

A rank that failed on its own (not in a collective) and will issue no more
operations can say so (`announce_failure`: a note below 0, `left_note`);
a peer's parked operation sees it at its next poll (`left`) and fails at
once, instead of waiting out its timeout. The note carries the number of
the last operation the sender completed: an operation it completed needs
nothing more from it (a broadcast it sent as root may still be on its way
to a receiver through a late rank), so a receiver parked on one goes on
waiting, and fails at its next operation. That works at every thread level:
with less than `MPI_THREAD_MULTIPLE` the notes go out from the MPI thread
(`MpiCollective.report_failure` queues them there), and a parked operation
is waited for there by `wait_watching`, which tests it and the notes in
turn (so no two threads are ever in MPI at once).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from atomr.train.comm.mpi.errors import (
    CollectiveError,
    CollectiveTimeoutError,
    RankFailedError,
)

__all__ = [
    "LEFT",
    "FailureNotes",
    "PeersLeft",
    "describe_missing",
    "failure_error",
    "left_note",
    "unusable_error",
]

_NOTE_TAG = 7
_SEND_WAIT_S = 1.0  # the longest `announce_failure` waits for its notes to go out
_PAUSE_S = (50e-6, 1e-3)  # `wait_watching` sleeps between tests: from this, doubling, to this
LEFT = -1
"""A note saying: the sender failed on its own and left the collectives,
having completed no operation; every note below 0 says so (`left_note`)."""


def left_note(completed: int) -> int:
    """The note of a rank that leaves after completing its operations up to
    number `completed` (0: none): `LEFT - completed`."""
    return LEFT - completed


class PeersLeft(Exception):
    """Raised by `FailureNotes.wait_watching`: a peer's `LEFT` note came
    before the operation completed (`FailureNotes.left` names them)."""


class FailureNotes:
    """The note exchange of one rank with its peers, on one communicator.

    Args:
        mpi: the `mpi4py.MPI` module.
        ctl: a communicator used for nothing else (a duplicate).
        enabled: False when the MPI lacks `MPI_THREAD_MULTIPLE`: `poll` is
            then a no-op and `gather` returns None, and only `LEFT` notes
            are exchanged, on the MPI thread (`announce_failure`,
            `wait_watching`).
        grace_s: the longest `gather` waits for the peers' notes.
    """

    def __init__(self, mpi: Any, ctl: Any, *, enabled: bool, grace_s: float) -> None:
        self._mpi = mpi
        self._ctl = ctl
        rank, size = ctl.Get_rank(), ctl.Get_size()
        self._peers = [r for r in range(size) if r != rank]
        self.enabled = enabled and bool(self._peers)
        self._grace_s = grace_s
        self._recvs: list[tuple[int, Any, np.ndarray]] | None = None
        self._sends: list[tuple[Any, np.ndarray]] = []
        self._notes: dict[int, int] = {}  # peer -> the operation its last note named
        self._sent: dict[int, int] = {}  # peer -> the operation our last note to it named
        self._announced = False  # `announce_failure` sent its notes

    def poll(self, state: int) -> None:
        """Collect peers' notes; answer a peer that sent one with `state`
        (the operation this rank is in), again whenever the state has moved."""
        if not self.enabled:
            return
        self._collect()
        for peer, note in self._notes.items():
            if note >= 0 and self._sent.get(peer) != state:
                self._send(peer, state)
        self._drop_completed_sends()

    def left(self, seq: int) -> list[int]:
        """The peers whose last note said they failed and left before
        completing operation `seq` (`left_note`): it cannot complete."""
        return [peer for peer, note in self._notes.items() if note < 0 and LEFT - note < seq]

    def waiter(self, request: Any, deadline: float | None, seq: int) -> Callable[[], None]:
        """What the MPI thread runs to wait for a parked `request` (of
        operation `seq`): `request.Wait` with `MPI_THREAD_MULTIPLE` (the
        loop's thread polls the notes meanwhile) or alone, else
        `wait_watching` until `deadline` (a `time.monotonic()`; None: none)."""
        if self.enabled or not self._peers:
            return request.Wait
        return partial(self.wait_watching, request, deadline, seq)

    def wait_watching(self, request: Any, deadline: float | None, seq: int) -> None:
        """On the MPI thread, without `MPI_THREAD_MULTIPLE`: test `request`
        and the peers' notes in turn, sleeping 50 us to 1 ms between tests,
        until it completes.

        Raises:
            PeersLeft: a peer's note said it left before completing
                operation `seq` (`left`).
            TimeoutError: `deadline` passed (the driver raised the
                operation's timeout already).
            mpi4py.MPI.Exception: the request failed.
        """
        pause, longest = _PAUSE_S
        while not request.Test():
            self._collect()
            if self.left(seq):
                raise PeersLeft
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError
            time.sleep(pause)
            pause = min(2 * pause, longest)

    def announce_failure(self, broken: CollectiveError | None = None, completed: int = 0) -> None:
        """Send every peer a note that this rank left after completing its
        operations up to number `completed` (`left_note`), and wait (up to
        1 s, blocking) for the sends to complete, so that they go out before
        this process ends.

        Without `MPI_THREAD_MULTIPLE`, call it on the MPI thread only.
        Nothing is sent in a world of one, on a second call, or when
        `broken` (the error that already broke the collective, if any) is a
        timeout or names other ranks (those that never joined or left, or
        that were at another operation): they take part in that failure and
        see it themselves, and a note would have them blame this rank. A
        failure of this rank alone (its local work, its loop stopped: no
        rank named) is told. Raises nothing (a send MPI refuses, to a dead
        peer, is skipped).
        """
        if not self.will_announce(broken):
            return
        self._announced = True
        for peer in self._peers:
            self._send(peer, left_note(completed))
        end = time.monotonic() + _SEND_WAIT_S
        while self._sends and time.monotonic() < end:
            self._drop_completed_sends()

    def will_announce(self, broken: CollectiveError | None) -> bool:
        """Whether `announce_failure(broken)` would send anything (see there)."""
        if not self._peers or self._announced:
            return False
        return broken is None or not (broken.ranks or isinstance(broken, CollectiveTimeoutError))

    async def gather(
        self, seq: int, state: int, until: asyncio.Future[None] | None = None
    ) -> dict[int, int | None] | None:
        """After operation `seq` failed here: send every peer a note, wait up
        to `grace_s` for theirs (or until `until` is done).

        Returns:
            {peer: the operation its note named, or None when no note came}
            for the peers not in `seq`; None when this MPI cannot tell.
        """
        if not self.enabled:
            return None if self._peers else {}
        for peer in self._peers:
            if self._notes.get(peer, 0) >= 0 and self._sent.get(peer) != state:
                self._send(peer, state)
        end = time.monotonic() + self._grace_s
        while True:
            self.poll(state)
            if until is not None and until.done():
                break
            if all(self._notes.get(p) == seq for p in self._peers):
                break
            if time.monotonic() >= end:
                break
            await asyncio.sleep(0.005)
        return {p: self._notes.get(p) for p in self._peers if self._notes.get(p) != seq}

    def close(self) -> None:
        """Withdraw the standing receives (when no failure happened)."""
        recvs, self._recvs = self._recvs, None
        for _, req, _ in recvs or ():
            try:
                req.Cancel()
                req.Wait()
            except self._mpi.Exception:
                pass

    def _collect(self) -> None:
        """Take the peers' notes that arrived (the last one of each counts)."""
        if self._recvs is None:
            self._recvs = [self._post_recv(p) for p in self._peers]
        for k, (peer, req, buf) in enumerate(self._recvs):
            try:
                arrived = req.Test()
            except self._mpi.Exception:
                continue
            if arrived:
                self._notes[peer] = int(buf[0])
                self._recvs[k] = self._post_recv(peer)

    def _post_recv(self, peer: int) -> tuple[int, Any, np.ndarray]:
        buf = np.zeros(1, dtype=np.int64)
        req = self._ctl.Irecv([buf, self._mpi.INT64_T], source=peer, tag=_NOTE_TAG)
        return peer, req, buf

    def _drop_completed_sends(self) -> None:
        """Forget the notes whose sends completed (or that MPI refused)."""
        self._sends = [(r, b) for r, b in self._sends if not _test(r, self._mpi)]

    def _send(self, peer: int, seq: int) -> None:
        buf = np.array([seq], dtype=np.int64)
        self._sent[peer] = seq
        try:
            req = self._ctl.Isend([buf, self._mpi.INT64_T], dest=peer, tag=_NOTE_TAG)
        except self._mpi.Exception:  # a dead peer: it will be named anyway
            return
        self._sends.append((req, buf))


def describe_missing(others: dict[int, int | None] | None) -> str:
    """The part of a failure message that says which ranks never joined,
    and which reported a failure of their own and left (both, when some
    did each)."""
    if others is None:
        return "could not tell which rank is missing (MPI lacks THREAD_MULTIPLE)"
    if not others:
        return "every rank had joined; a rank failed during the operation"
    left = [p for p, v in others.items() if v is not None and v < 0]
    missing = {p: v for p, v in others.items() if v is None or v >= 0}
    parts = [_describe_never_joined(missing)] if missing else []
    if len(left) == 1:
        parts.append(f"rank {left[0]} reported a failure of its own and left (see its error)")
    elif left:
        names = ", ".join(str(r) for r in left)
        parts.append(f"ranks {names} reported failures of their own and left (see their errors)")
    return "; ".join(parts)


def _describe_never_joined(missing: dict[int, int | None]) -> str:
    """The ranks that never answered for the operation (`None`), or answered
    for another (the operation they are at)."""
    names = ", ".join(str(r) for r in missing)
    word = "rank" if len(missing) == 1 else "ranks"
    detail = f"{word} {names} never joined (dead, stuck or out of step)"
    seen = [f"rank {p} is at operation #{v}" for p, v in missing.items() if v is not None]
    if seen:
        detail += f"; {', '.join(seen)}"
    return detail


def failure_error(
    operation: str, rank: int, world_size: int, others: dict[int, int | None] | None, what: str
) -> RankFailedError:
    """The error of `operation` (e.g. "all_reduce #7"), failed on `rank`
    for the reason `what`; `others` as `FailureNotes.gather` returns.
    `CollectiveTimeoutError` when `what` says it timed out."""
    where = f"MPI {operation} on rank {rank} of {world_size} {what}"
    cls = CollectiveTimeoutError if what.startswith("timed out") else RankFailedError
    return cls(
        f"{where}: {describe_missing(others)}", ranks=list(others or ()), operation=operation
    )


def unusable_error(broken: CollectiveError) -> RankFailedError:
    """What an operation raises after `broken` broke the collective."""
    return RankFailedError(
        f"collective unusable after an earlier failure: {broken}",
        ranks=broken.ranks,
        operation=broken.operation,
    )


def _test(req: Any, mpi: Any) -> bool:
    try:
        return bool(req.Test())
    except mpi.Exception:
        return True
