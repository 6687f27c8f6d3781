"""`agree_on_failure` with `place`: the processes that did not fail learn
which ranks did; the failing process's own error is noted with its rank."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from atomr.train.comm import Collective
from atomr.train.comm.agreement import agree_on_failure


class _OthersAdd(Collective):
    """One process of a job whose other processes' contributions are given:
    `all_reduce` adds them to this process's buffer."""

    def __init__(self, others: Sequence[np.ndarray]) -> None:
        self.others = others

    async def all_reduce(self, buffers: Sequence[Any]) -> Any:
        return buffers[0] + sum(self.others)

    async def reduce_scatter(self, buffers: Sequence[Any]) -> Any:
        raise NotImplementedError

    async def all_gather(self, buffers: Sequence[Any]) -> Any:
        raise NotImplementedError

    async def broadcast(self, buffers: Sequence[Any], root: int = 0) -> None:
        raise NotImplementedError

    async def barrier(self, buffers: Sequence[Any] = ()) -> None:
        raise NotImplementedError


def _failed(rank: int, count: int) -> np.ndarray:
    """What a process of rank `rank` that failed adds (flag, value, one flag per rank)."""
    row = np.zeros(2 + count)
    row[0] = row[2 + rank] = 1.0
    return row


def _plain(who: str, what: str) -> Exception:
    return RuntimeError(f"{who} failed to {what}")


async def test_the_others_error_names_every_failed_rank() -> None:
    processes = _OthersAdd([_failed(0, 3), _failed(2, 3)])
    with pytest.raises(RuntimeError, match=r"^process ranks 0, 2 failed to start$"):
        await agree_on_failure(processes, None, "start", others=_plain, place=(1, 3))


async def test_without_place_the_others_error_counts_the_failed_processes() -> None:
    processes = _OthersAdd([np.array([1.0, 0.0]), np.array([1.0, 0.0])])
    with pytest.raises(RuntimeError, match=r"^2 other process\(es\) failed to start$"):
        await agree_on_failure(processes, None, "start", others=_plain)


async def test_the_failing_process_raises_its_own_error_noted_with_its_rank() -> None:
    own = ValueError("no device")
    with pytest.raises(ValueError, match="no device") as raised:
        await agree_on_failure(_OthersAdd([np.zeros(4)]), own, "start", place=(1, 2))
    assert raised.value is own
    assert raised.value.__notes__ == ["on process rank 1: the others were told it failed to start"]
