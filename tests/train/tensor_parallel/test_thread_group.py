"""`ThreadGroup`: the shards' threads meet mid-pass; every one gets the same
sum (in shard order) or concatenation, a failing shard wakes the others at
once, and a shard that never comes is a `GroupBroken` after the deadline."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from atomr.train.tensor_parallel._thread_group import GroupBroken, ThreadGroup


def _run(group: ThreadGroup, work) -> list[object]:
    results: list[object] = [None] * group.n

    def one(rank: int) -> None:
        try:
            results[rank] = work(rank)
        except GroupBroken as exc:
            results[rank] = exc

    threads = [threading.Thread(target=one, args=(k,)) for k in range(group.n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return results


def test_every_shard_gets_the_same_sum_and_gather_twice_in_a_row() -> None:
    group = ThreadGroup(3, timeout=5)
    parts = [np.full(4, float(k + 1), dtype=np.float32) for k in range(3)]

    def work(rank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        first = group.all_reduce(rank, parts[rank]).copy()
        second = group.all_reduce(rank, parts[rank] * 2).copy()
        return first, second, group.all_gather(rank, parts[rank][:2]).copy()

    results = _run(group, work)
    for first, second, gathered in results:  # type: ignore[misc]
        np.testing.assert_array_equal(first, np.full(4, 6.0))
        np.testing.assert_array_equal(second, np.full(4, 12.0))
        np.testing.assert_array_equal(gathered, [1, 1, 2, 2, 3, 3])


def test_a_failing_shard_wakes_the_others_and_reset_makes_the_group_usable() -> None:
    group = ThreadGroup(2, timeout=30)

    def work(rank: int) -> object:
        if rank == 1:
            time.sleep(0.05)  # the shard fails late, while the other waits in all_reduce
            group.abort()
            return "failed"
        return group.all_reduce(rank, np.ones(2))

    started = time.perf_counter()
    results = _run(group, work)
    assert isinstance(results[0], GroupBroken) and results[1] == "failed"
    assert time.perf_counter() - started < 5  # not the 30 s deadline
    assert group.broken  # until reset: a late shard fails at once, it meets no one
    with pytest.raises(GroupBroken):
        group.all_reduce(1, np.ones(2))
    group.reset()
    assert not group.broken
    again = _run(group, lambda rank: group.all_reduce(rank, np.ones(2)).copy())
    np.testing.assert_array_equal(again[0], [2.0, 2.0])


def test_a_shard_that_never_comes_is_a_deadline() -> None:
    group = ThreadGroup(2, timeout=0.2)
    with pytest.raises(GroupBroken):
        group.all_reduce(0, np.ones(2))
    assert group.broken
