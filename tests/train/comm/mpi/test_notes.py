"""`FailureNotes.announce_failure` and `MpiCollective.report_failure` are
harmless where they need not tell anyone: a world of one, a second call, a
collective broken by a failure the other ranks took part in, a peer MPI
refuses to send to, a send that never completes (bounded). Without
`MPI_THREAD_MULTIPLE` the notes still go out (from the MPI thread), and a
parked operation is waited for by `wait_watching`, which sees them. On
loopback with peers: `test_collective.py` (a rank's report, at both thread
levels; a survivor's report after the failure, which names no one else)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import pytest

from atomr.train.comm.mpi._notes import (
    LEFT,
    FailureNotes,
    PeersLeft,
    describe_missing,
    left_note,
)
from atomr.train.comm.mpi.errors import (
    CollectiveMismatchError,
    CollectiveTimeoutError,
    RankFailedError,
)


class _FakeMpiError(Exception):
    pass


class _FakeMpi:
    """What `FailureNotes` uses of `mpi4py.MPI`."""

    Exception = _FakeMpiError
    INT64_T = "int64"


class _Request:
    """Completes at its `after`-th test (0: never; `done`: at once)."""

    def __init__(self, done: bool, after: int = 0) -> None:
        self.done, self.after, self.tests = done, after, 0

    def Test(self) -> bool:  # noqa: N802 (mpi4py's name)
        self.tests += 1
        return self.done or self.tests == self.after

    def Wait(self) -> None:  # noqa: N802
        raise AssertionError("not called by the tests")


class _Receive:
    """A standing receive from `source`: completes when the inbox holds a note."""

    def __init__(self, comm: _Comm, buf: np.ndarray, source: int) -> None:
        self.comm, self.buf, self.source = comm, buf, source

    def Test(self) -> bool:  # noqa: N802
        queued = self.comm.inbox.get(self.source)
        if not queued:
            return False
        self.buf[0] = queued.pop(0)
        return True


class _Comm:
    """A communicator of `size` ranks that records the notes sent; sends to
    the ranks in `refused` fail, and the others complete when `complete`."""

    def __init__(self, size: int, *, refused: tuple[int, ...] = (), complete: bool = True) -> None:
        self.size, self.refused, self.complete = size, refused, complete
        self.sent: list[tuple[int, int]] = []
        self.inbox: dict[int, list[int]] = {}  # source -> the notes it sent, in order

    def Get_rank(self) -> int:  # noqa: N802
        return 0

    def Get_size(self) -> int:  # noqa: N802
        return self.size

    def Irecv(self, message: Any, source: int, tag: int) -> _Receive:  # noqa: N802
        return _Receive(self, message[0], source)

    def Isend(self, message: Any, dest: int, tag: int) -> _Request:  # noqa: N802
        if dest in self.refused:
            raise _FakeMpiError(f"rank {dest} is gone")
        self.sent.append((dest, int(message[0][0])))
        return _Request(self.complete)


def _notes(comm: _Comm, enabled: bool = True) -> FailureNotes:
    return FailureNotes(_FakeMpi(), comm, enabled=enabled, grace_s=1.0)


def test_without_thread_multiple_the_notes_go_out_from_the_calling_thread() -> None:
    """Not enabled: no exchange from the loop's thread, but the caller (the
    MPI thread, `MpiCollective.report_failure`) still sends `LEFT`."""
    comm = _Comm(3)
    notes = _notes(comm, enabled=False)
    notes.announce_failure()
    notes.announce_failure()
    assert not notes.enabled and comm.sent == [(1, LEFT), (2, LEFT)]


def test_without_thread_multiple_a_parked_wait_sees_a_left_note() -> None:
    """`wait_watching` (the MPI thread's wait below MULTIPLE) tests the
    operation and the notes in turn: a LEFT note raises `PeersLeft` naming
    its sender; a completed operation returns; a passed deadline raises."""
    comm = _Comm(3)
    notes = _notes(comm, enabled=False)
    request = _Request(False)
    comm.inbox[2] = [LEFT]
    with pytest.raises(PeersLeft):
        notes.wait_watching(request, None, 1)
    assert notes.left(1) == [2] and request.tests == 1

    quiet = _notes(_Comm(3), enabled=False)
    slow = _Request(False, after=4)
    quiet.wait_watching(slow, None, 1)
    assert slow.tests == 4 and quiet.left(1) == []
    with pytest.raises(TimeoutError):
        quiet.wait_watching(_Request(False), time.monotonic(), 1)


def test_a_note_spares_the_operations_its_sender_completed() -> None:
    """A rank that leaves says up to which operation it completed its part:
    those need nothing more from it; the next one cannot complete."""
    comm = _Comm(3)
    _notes(comm).announce_failure(completed=5)
    assert comm.sent == [(1, left_note(5)), (2, left_note(5))] == [(1, -6), (2, -6)]
    assert left_note(0) == LEFT
    comm_in = _Comm(3)
    watcher = _notes(comm_in, enabled=False)
    comm_in.inbox[1] = [left_note(5)]
    slow = _Request(False, after=3)
    watcher.wait_watching(slow, None, 5)  # completed by rank 1: waits it out
    assert slow.tests == 3 and watcher.left(5) == [] and watcher.left(6) == [1]
    with pytest.raises(PeersLeft):
        watcher.wait_watching(_Request(False), None, 6)
    assert describe_missing({1: left_note(5)}) == (
        "rank 1 reported a failure of its own and left (see its error)"
    )


def test_the_wait_watches_notes_only_below_thread_multiple() -> None:
    request = _Request(False)
    assert _notes(_Comm(3)).waiter(request, None, 1) == request.Wait
    assert _notes(_Comm(1), enabled=False).waiter(request, None, 1) == request.Wait
    assert _notes(_Comm(3), enabled=False).waiter(request, None, 1) != request.Wait


def test_the_notes_go_out_once_to_every_peer() -> None:
    comm = _Comm(3)
    notes = _notes(comm)
    notes.announce_failure()
    notes.announce_failure()
    assert comm.sent == [(1, LEFT), (2, LEFT)]


def test_a_world_of_one_has_nobody_to_tell() -> None:
    comm = _Comm(1)
    notes = _notes(comm)
    notes.announce_failure()
    assert not notes.enabled and comm.sent == []


@pytest.mark.parametrize(
    "broken",
    [
        CollectiveTimeoutError("timed out", ranks=[2]),
        RankFailedError("rank 2 left", ranks=[2]),
        CollectiveMismatchError("out of step", ranks=[1, 2]),
    ],
)
def test_after_a_failure_the_others_took_part_in_nothing_is_sent(broken: Exception) -> None:
    comm = _Comm(3)
    _notes(comm).announce_failure(broken)  # type: ignore[arg-type]
    assert comm.sent == []


def test_after_a_failure_of_this_rank_alone_the_notes_go_out() -> None:
    comm = _Comm(2)
    _notes(comm).announce_failure(RankFailedError("cancelled in flight (its event loop stopped)"))
    assert comm.sent == [(1, LEFT)]


def test_a_refused_send_is_skipped_and_a_stuck_one_waited_for_at_most_a_second() -> None:
    comm = _Comm(3, refused=(1,), complete=False)
    started = time.monotonic()
    _notes(comm).announce_failure()
    took = time.monotonic() - started
    assert comm.sent == [(2, LEFT)]
    assert 0.9 < took < 1.5, took


def test_a_rank_that_left_and_one_that_never_joined_are_both_named() -> None:
    assert describe_missing({1: None, 2: LEFT}) == (
        "rank 1 never joined (dead, stuck or out of step); "
        "rank 2 reported a failure of its own and left (see its error)"
    )
    assert describe_missing({1: LEFT, 3: LEFT}) == (
        "ranks 1, 3 reported failures of their own and left (see their errors)"
    )
    assert describe_missing({1: 4}) == (
        "rank 1 never joined (dead, stuck or out of step); rank 1 is at operation #4"
    )


def test_report_failure_in_a_world_of_one_breaks_the_collective_harmlessly() -> None:
    pytest.importorskip("mpi4py")
    from atomr.train.comm.mpi.collective import MpiCollective

    async def go() -> None:
        coll = MpiCollective(timeout=5.0)
        await coll.barrier()
        coll.report_failure()
        coll.report_failure()
        assert coll.broken
        with pytest.raises(RankFailedError, match="rank 0 reported a failure of its own") as later:
            await coll.all_reduce(np.zeros(3))
        assert later.value.ranks == (0,)
        coll.close()

    asyncio.run(go())
