"""`WorkerClocks`: the per-worker clocks of bounded staleness (stale
synchronous parallel, SSP).

A worker's clock counts the batches it finished (a push, an empty push or an
abort). Under `Consistency.bounded(s)` a worker's pull waits while its clock
leads the slowest worker's by more than `s`; a held pull is answered once a
tick of the slowest worker brings the lead back within `s`.
"""

from __future__ import annotations

from atomr.actor import Reply

__all__ = ["WorkerClocks"]


class WorkerClocks:
    """The clocks and held pulls of one server shard.

    Args:
        workers: the known workers' count (their clocks start at 0), or None
            when the shard does not know its workers (clocks appear on first tick).
        bound: the slack `s`, or None when pulls are never held.
    """

    def __init__(self, workers: int | None, bound: int | None) -> None:
        self.bound = bound
        self._clocks: dict[int, int] = {w: 0 for w in range(workers or 0)}
        self._held: list[tuple[int, Reply]] = []

    def tick(self, worker: int) -> None:
        """`worker` finished a batch."""
        self._clocks[worker] = self._clocks.get(worker, 0) + 1

    def lead(self, worker: int) -> int:
        """How many batches `worker` is ahead of the slowest worker (0 without clocks)."""
        if not self._clocks:
            return 0
        return self._clocks.get(worker, 0) - min(self._clocks.values())

    def blocked(self, worker: int) -> bool:
        """True when `worker`'s pull must wait."""
        return self.bound is not None and self.lead(worker) > self.bound

    def hold(self, worker: int, reply: Reply) -> None:
        """Keep `worker`'s pull until `release` frees it."""
        self._held.append((worker, reply))

    def release(self) -> list[tuple[int, Reply]]:
        """The held pulls that may now be answered (they are no longer held)."""
        freed = [(w, r) for w, r in self._held if not self.blocked(w)]
        self._held = [(w, r) for w, r in self._held if self.blocked(w)]
        return freed
