"""`LastResult`: the round and `BatchResult` of the last part a
parameter-server worker trained, kept outside the worker's instance.

A part sent again after its push landed (its worker failed once it was done,
so its answer was lost) must be answered with the result computed before its
round, not recomputed from the weights the round left. The trainer makes one
`LastResult` per worker and gives it to the worker's `Props`, which a
restart builds the new instance from: a worker restarted after its own
`ContextPoisoned` still answers that part with its result.
"""

from __future__ import annotations

from atomr.train.parameter_server.messages import BatchResult

__all__ = ["LastResult"]


class LastResult:
    """The last part's round and result (module docstring); empty at first."""

    def __init__(self) -> None:
        self._kept: tuple[int, BatchResult] | None = None

    def take(self, round_id: int | None) -> BatchResult | None:
        """The result kept for `round_id` (kept on), or None: then whatever
        was kept, for another round or none, is forgotten."""
        kept = self._kept
        if kept is not None and round_id is not None and kept[0] == round_id:
            return kept[1]
        self._kept = None
        return None

    def keep(self, round_id: int | None, result: object) -> None:
        """Keep `result` as `round_id`'s when it is a `BatchResult` of a round."""
        if isinstance(result, BatchResult) and round_id is not None:
            self._kept = (round_id, result)
