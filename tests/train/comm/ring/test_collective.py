"""`RingCollective` when a member fails, is gone, or does not take part:
every operation raises the documented error within a deadline (never hangs),
every member is told to abort, and the members stay usable."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from atomr import ActorRef, ActorStoppedError
from atomr.actor import actor_failed
from atomr.train.comm.ring import RingCollective, RingMismatchError, RingTimeoutError
from atomr.train.comm.ring.member import RingMember

DEADLINE_S = 10.0  # far above what any case below needs; a hang fails the test
OPERATIONS = ["all_reduce", "reduce_scatter", "all_gather", "broadcast"]


def _buffers(n: int, size: int = 30) -> list[np.ndarray]:
    rng = np.random.default_rng(n)
    return [rng.standard_normal(size).astype(np.float32) for _ in range(n)]


async def _run(ring: RingCollective, operation: str, refs: list[ActorRef], **kw: Any) -> Any:
    """`operation` over `refs`, or `DeadlineExceeded` (a failed test) past the deadline."""
    return await asyncio.wait_for(getattr(ring, operation)(refs, **kw), DEADLINE_S)


@pytest.mark.parametrize(
    ("operation", "fault"),
    [
        ("all_reduce", "fail_add"),
        ("reduce_scatter", "fail_add"),
        ("all_gather", "fail_write"),
        ("broadcast", "fail_write"),
    ],
)
async def test_a_failing_member_raises_its_own_error(
    spawn_ring: Callable[..., list[ActorRef]], operation: str, fault: str
) -> None:
    """The member failed on its own buffer work and was restarted by its
    supervisor: its error is marked `actor_failed` (its state is lost), as
    every error that escaped an actor is; it was answered unmarked, as if
    the member had kept its state."""
    refs = spawn_ring(_buffers(3), faults={1: fault})
    ring = RingCollective(timeout=5.0)
    with pytest.raises(RuntimeError, match=f"injected {fault[5:]} failure") as info:
        await _run(ring, operation, refs)
    assert info.value.failed_workers == [1]
    assert info.value.worker_index == 1
    assert actor_failed(info.value)
    # the members keep working: a later ring among the healthy ones succeeds
    await _run(ring, operation, [refs[0], refs[2]])


@pytest.mark.parametrize("operation", OPERATIONS)
async def test_a_member_that_is_gone_raises_actor_stopped(
    spawn_ring: Callable[..., list[ActorRef]], operation: str
) -> None:
    refs = spawn_ring(_buffers(3))
    await refs[2].stop()
    ring = RingCollective(timeout=5.0)
    with pytest.raises(ActorStoppedError) as info:
        await _run(ring, operation, refs)
    assert info.value.failed_workers == [2]
    with pytest.raises(ActorStoppedError):
        await asyncio.wait_for(ring.barrier(refs), DEADLINE_S)
    await _run(ring, operation, refs[:2])  # the others were aborted cleanly


@pytest.mark.parametrize("operation", OPERATIONS)
async def test_a_member_that_does_not_take_part_times_the_ring_out(
    spawn_ring: Callable[..., list[ActorRef]], operation: str
) -> None:
    """Member 1 answers at once without sending a chunk (out of step): its
    successors wait `timeout` for its chunk and raise `RingTimeoutError`."""
    refs = spawn_ring(_buffers(3), faults={1: "absent"}, timeout=0.3)
    ring = RingCollective(timeout=0.3)
    with pytest.raises(RingTimeoutError, match="within 0.3s") as info:
        await _run(ring, operation, refs)
    assert 1 not in info.value.failed_workers
    assert info.value.worker_index in (0, 2)
    assert not actor_failed(info.value)  # the member that timed out is intact


async def test_a_stalled_member_times_its_successor_out(
    spawn_ring: Callable[..., list[ActorRef]],
) -> None:
    """Member 1 blocks in its own buffer work: member 2 waits `timeout` for
    its chunk and fails first; the call returns once member 1's ask has
    given up too (`2 * timeout + 5` s), with member 2's error."""
    refs = spawn_ring(_buffers(3), faults={1: "stall"}, timeout=0.3)
    ring = RingCollective(timeout=0.3)
    with pytest.raises(RingTimeoutError) as info:
        await _run(ring, "reduce_scatter", refs)
    assert info.value.worker_index == 2
    assert 1 in info.value.failed_workers


async def test_an_interrupt_aborts_every_member_at_once(
    spawn_ring: Callable[..., list[ActorRef]],
) -> None:
    """Member 1 never sends its chunks, so the others would wait 60 s for
    them; the interrupt ends the operation at once instead."""
    refs = spawn_ring(_buffers(3), faults={1: "absent"}, timeout=60.0)
    ring = RingCollective(timeout=60.0)
    interrupt: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()
    operation = asyncio.ensure_future(ring.reduce_scatter(refs, interrupt=interrupt))
    interrupt.set_result(RuntimeError("stop the ring"))
    with pytest.raises(RuntimeError, match="stop the ring") as info:
        await asyncio.wait_for(operation, DEADLINE_S)
    assert info.value.failed_workers == []


async def test_an_operation_cancelled_mid_session_leaves_no_ask_behind(
    spawn_ring: Callable[..., list[ActorRef]], caplog: pytest.LogCaptureFixture
) -> None:
    """A trainer stopped mid all-reduce (its handler cancelled): the asks to
    the members ran on, unread, and when the members stopped too asyncio
    logged "Task exception was never retrieved" for each; the members were
    not told to abort either, and waited for chunks that never came."""
    refs = spawn_ring(_buffers(3), faults={1: "absent"}, timeout=60.0)
    ring = RingCollective(timeout=60.0)
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        operation = asyncio.ensure_future(ring.all_reduce(refs))
        await asyncio.sleep(0)  # the operation sends its messages
        await asyncio.wait_for(ring.barrier(refs), DEADLINE_S)  # every member has its own
        operation.cancel()
        with pytest.raises(asyncio.CancelledError):
            await operation
        del operation
        for ref in refs:
            await asyncio.wait_for(ref.stop(), DEADLINE_S)
        gc.collect()
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


async def test_ring_rejects_non_refs() -> None:
    with pytest.raises(TypeError, match="ActorRef"):
        await RingCollective().all_reduce([np.zeros(3)])
    with pytest.raises(TypeError, match="ActorRef"):
        await RingCollective().barrier([np.zeros(3)])
    for operation in OPERATIONS:
        with pytest.raises(ValueError, match="at least one"):
            await getattr(RingCollective(), operation)([])
    with pytest.raises(ValueError):
        RingCollective(timeout=0)


@pytest.mark.parametrize(
    ("timeout", "error", "message"),
    [
        (True, TypeError, "timeout must be a number of seconds, got bool"),
        (float("nan"), ValueError, "timeout must be > 0 seconds, got nan"),
        (-1.0, ValueError, "timeout must be > 0 seconds, got -1.0"),
        (None, TypeError, "timeout must be a number of seconds, got NoneType"),
        ("5", TypeError, "timeout must be a number of seconds, got str"),
    ],
)
def test_a_bad_ring_timeout_is_refused(timeout: Any, error: type, message: str) -> None:
    """The ring's waits take the runtime's one timeout rule (`check_delay`),
    the collective and each member alike: a bool was taken as one second, a
    member took NaN or a negative timeout (every chunk wait failing at
    once), and a str or None failed with a comparison's TypeError."""
    with pytest.raises(error, match=f"^{message}$"):
        RingCollective(timeout=timeout)
    with pytest.raises(error, match=f"^{message}$"):
        RingMember(object(), timeout=timeout)  # type: ignore[arg-type]


@pytest.mark.parametrize("operation", [*OPERATIONS, "barrier"])
async def test_a_member_named_twice_is_refused_before_any_is_asked(
    spawn_ring: Callable[..., list[ActorRef]], operation: str
) -> None:
    """One actor at two places of the ring, with one buffer: its chunks
    collided, and the operation failed with a NumPy shape error or, when the
    chunks happened to line up, left wrong sums, silently."""
    arrays = [np.arange(7.0), np.ones(7)]
    refs = spawn_ring(arrays)
    ring = RingCollective(timeout=5.0)
    with pytest.raises(ValueError, match="ring members 0 and 2 are the same actor"):
        await _run(ring, operation, [refs[0], refs[1], refs[0]])
    for ref, array in zip(refs, arrays, strict=True):  # nothing was sent
        np.testing.assert_array_equal(await ref.ask("get"), array)


@pytest.mark.parametrize("operation", OPERATIONS)
@pytest.mark.parametrize(
    "arrays",
    [
        [np.ones(4), np.ones(2), np.ones(4)],  # a shorter buffer
        [np.ones(2), np.ones(4), np.ones(4)],  # ... as the root too
        [np.ones(4), np.ones(5)],  # one element more
        [np.ones(4, np.float32), np.ones(4), np.ones(4, np.float32)],  # another dtype
    ],
    ids=["shorter", "shorter_root", "longer", "dtype"],
)
async def test_members_whose_buffers_differ_are_refused(
    spawn_ring: Callable[..., list[ActorRef]], operation: str, arrays: list[np.ndarray]
) -> None:
    """Every member cut its own buffer with its own length: a broadcast from
    a 2-element root wrote each 1-element chunk over 2 elements of a
    4-element member (NumPy broadcasting), a float64 sum was rounded into a
    float32 member, silently; the others failed with a NumPy shape error
    that crashed the member. Now `RingMismatchError`, naming both buffers."""
    refs = spawn_ring(arrays)
    ring = RingCollective(timeout=5.0)
    with pytest.raises(RingMismatchError, match="buffer of"):
        await _run(ring, operation, refs)
    same = [
        ref for ref, a in zip(refs, arrays, strict=True) if a.size == 4 and a.dtype == np.float64
    ]
    await _run(ring, operation, same)  # the members stay usable
