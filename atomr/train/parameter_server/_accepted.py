"""`AcceptedRounds`: which trainer rounds a server shard took each worker's
push (or abort) for, so that a part the trainer sends again after its push
landed (its worker failed before answering, and was restarted) is answered
without being applied a second time.

The trainer numbers its rounds (`TrainBatch.round_id`, increasing: one per
global batch) and every push and abort carries its part's round. A shard
remembers, per worker, the last round it took; a push of that round or an
earlier one is a copy. Pushes without a round (a shard used on its own) are
never taken for copies.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["AcceptedRounds"]


class AcceptedRounds:
    """The last round taken per worker (module docstring)."""

    def __init__(self) -> None:
        self._last: dict[int, int] = {}

    def taken(self, worker: int, round_id: int | None) -> bool:
        """True when `worker`'s push of `round_id` (or of a later round) was
        taken already; never for None."""
        if round_id is None:
            return False
        last = self._last.get(worker)
        return last is not None and round_id <= last

    def take(self, entries: Iterable[tuple[int, int | None]]) -> dict[int, int | None]:
        """Record the `(worker, round_id)` pushes as taken (None: not recorded).

        Returns:
            What was recorded before for those workers (None: nothing), for `restore`.
        """
        previous: dict[int, int | None] = {}
        for worker, round_id in entries:
            if round_id is None:
                continue
            last = self._last.get(worker)
            previous.setdefault(worker, last)
            self._last[worker] = round_id if last is None else max(last, round_id)
        return previous

    def restore(self, previous: dict[int, int | None]) -> None:
        """Forget pushes taken since `take` returned `previous` (their round was undone)."""
        for worker, round_id in previous.items():
            if round_id is None:
                self._last.pop(worker, None)
            else:
                self._last[worker] = round_id
