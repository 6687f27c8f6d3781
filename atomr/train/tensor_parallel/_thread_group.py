"""`ThreadGroup`: all-reduce and all-gather among the shards' device threads.

The shards of a `LayerTensorParallelTrainer` live in one process, each
computing on its device's worker thread. A layer that splits its work
(`_layer_rules`) meets the other shards in the middle of a forward or
backward pass: every shard's thread hands in its host array and waits until
all have; the sum (in shard order, so every shard gets the same bits) or the
concatenation is then read by all. The reduction is host-side, as every
in-process reduction of atomr.

Every wait has a deadline (`timeout`), and a shard that fails calls `abort`,
which wakes the others at once with `GroupBroken`. The group stays broken
(every later wait fails at once) until the trainer `reset`s it, which it does
only once every shard is done with the failed pass: a late shard that met a
reset group would be paired with the next pass's data.
"""

from __future__ import annotations

import threading

import numpy as np

__all__ = ["GroupBroken", "ThreadGroup"]


class GroupBroken(RuntimeError):
    """Another shard failed or did not arrive in time: this pass is abandoned."""


class ThreadGroup:
    """The meeting point of `n` shards' threads.

    Args:
        n: the shards.
        timeout: seconds a shard waits for the others (None: forever).
    """

    def __init__(self, n: int, timeout: float | None) -> None:
        self.n = n
        self.timeout = timeout
        self._barrier = threading.Barrier(n, timeout=timeout)
        self._slots: list[np.ndarray | None] = [None] * n
        self._result: np.ndarray | None = None

    def _wait(self) -> int:
        try:
            return self._barrier.wait()
        except threading.BrokenBarrierError:
            raise GroupBroken("a tensor-parallel shard failed or timed out mid-pass") from None

    def _meet(self, rank: int, array: np.ndarray, combine: str) -> np.ndarray:
        self._slots[rank] = np.ascontiguousarray(array)
        if self._wait() == 0:  # one thread combines, in shard order
            parts = [s for s in self._slots if s is not None]
            if combine == "sum":
                out = parts[0].copy()
                for part in parts[1:]:
                    out += part
            else:
                out = np.concatenate(parts, axis=-1)
            self._result = out
        self._wait()
        result = self._result
        assert result is not None
        return result

    def all_reduce(self, rank: int, array: np.ndarray) -> np.ndarray:
        """The sum of every shard's `array` (a host array, not to be written).

        Raises:
            GroupBroken: a shard failed, or the wait passed `timeout`.
        """
        return self._meet(rank, array, "sum")

    def all_gather(self, rank: int, array: np.ndarray) -> np.ndarray:
        """Every shard's `array` concatenated along the last axis, in shard order.

        Raises:
            GroupBroken: as `all_reduce`.
        """
        return self._meet(rank, array, "concat")

    def abort(self) -> None:
        """Wake every waiting shard with `GroupBroken` (a shard failed)."""
        self._barrier.abort()

    @property
    def broken(self) -> bool:
        """Aborted, or a wait timed out, since the last `reset`."""
        return self._barrier.broken

    def reset(self) -> None:
        """Make the group usable again after an abort (between requests)."""
        self._barrier.reset()
        self._slots = [None] * self.n
        self._result = None
