"""`SynchronousRound`: the pushes a synchronous server shard holds until every
worker has pushed for the current version.

A round holds one entry per worker: a gradient (`PushGradient`) or an abort
(`AbortPush`, a worker without a usable gradient: the round is dropped, every
push of it failing with `RoundDroppedError`). A worker restarted
mid-round pushes again: its newer push replaces the older one, whose asker
is told it was superseded. Once the round is full, `round_update` turns it
into the weighted parts to apply, or the error that every push of it gets.
An applied round stays undoable (`StagedRound`) until the shard's next
update, so that a round failing on another shard is undone on every shard
(`RollbackRound`); a round whose update fails on a shard is answered with
`RoundFailedError` there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from atomr.actor import Reply
from atomr.actor.errors import bounded_repr
from atomr.train.core.device_guard import REQUEST_ERRORS
from atomr.train.core.errors import NonFiniteError
from atomr.train.parameter_server.messages import StaleGradientError

__all__ = [
    "PendingPush",
    "RoundDroppedError",
    "RoundFailedError",
    "StagedRound",
    "SynchronousRound",
    "round_failure",
    "round_update",
]


class RoundDroppedError(NonFiniteError):
    """A synchronous round was dropped because another worker aborted it (it
    had no usable gradient, or gave up on its part): every push of the round
    fails with this, naming the aborting workers. It follows from that
    worker's own failure, which is what a trainer's request reports."""


class RoundFailedError(RuntimeError):
    """A synchronous round failed on a server shard: its update raised there
    (the error is this one's `__cause__`), so that shard applied nothing of
    it, or a worker found the shards at different versions (a round applied
    on some of them only). The trainer then rolls the round back on every
    shard (`RollbackRound`): a request answered with it applied nothing
    (its notes say so, or name a shard that could not be rolled back). It
    is not sent to the workers again: a copy of the part would be computed
    from weights some shards had already moved on from."""


@dataclass(frozen=True)
class StagedRound:
    """A synchronous shard's last round, applied but still undoable.

    Attributes:
        round_ids: the trainer rounds of its pushes (`PushGradient.round_id`).
        taken_before: what `AcceptedRounds.take` returned when its pushes
            were taken (restored if it is undone).
        parts: the gradients it applied (undone from the shard's counters).
    """

    round_ids: frozenset[int]
    taken_before: dict[int, int | None]
    parts: int


@dataclass
class PendingPush:
    """A push (or abort) waiting for the rest of its round.

    Attributes:
        gradient: the pushed gradient (None for an abort).
        weight: the batch's loss normaliser (0 for an empty batch or an abort).
        reply: the pusher's deferred reply.
        abort: the reason of an `AbortPush`, else None.
        wants_weights: answer with `PushedWeights` (the push's `return_weights`).
        round_id: the trainer's round of the push (`PushGradient.round_id`).
    """

    gradient: np.ndarray | None
    weight: float
    reply: Reply
    abort: str | None = None
    wants_weights: bool = False
    round_id: int | None = None


class SynchronousRound:
    """The current round of a synchronous server shard.

    Args:
        workers: how many workers push in every round.
    """

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._entries: dict[int, PendingPush] = {}

    @property
    def in_progress(self) -> bool:
        """True while some worker's push waits for the others."""
        return bool(self._entries)

    def join(self, worker: int, entry: PendingPush) -> list[tuple[int, PendingPush]] | None:
        """Add `worker`'s push; a push of the same worker already in the round
        is replaced (its asker gets a `StaleGradientError`).

        Returns:
            The full round in worker order (the round starts empty again), or
            None while some worker has not pushed.
        """
        previous = self._entries.pop(worker, None)
        if previous is not None:
            previous.reply.set_exception(
                StaleGradientError(0, 0, f"superseded by a newer push of worker {worker}")
            )
        self._entries[worker] = entry
        if len(self._entries) < self.workers:
            return None
        ordered = sorted(self._entries.items())
        self._entries = {}
        return ordered


def round_update(ordered: list[tuple[int, PendingPush]]) -> list[tuple[np.ndarray, float]]:
    """The parts a full round applies: each gradient with its weight's share
    of the round's total (`sum(w_i g_i) / sum(w_i)`); empty batches add nothing.

    Args:
        ordered: the round, from `SynchronousRound.join`.

    Returns:
        `(gradient, coefficient)` pairs.

    Raises:
        RoundDroppedError: the round holds an abort (naming every aborting worker).
        ValueError: every batch of the round was empty.
    """
    aborts = [f"worker {w}: {p.abort}" for w, p in ordered if p.abort is not None]
    if aborts:
        raise RoundDroppedError("; ".join(aborts) + " (the whole round was dropped)")
    total = sum(p.weight for _, p in ordered)
    if total <= 0.0:
        raise ValueError("every batch of the round was empty")
    return [
        (p.gradient, p.weight / total)
        for _, p in ordered
        if p.gradient is not None and p.weight > 0.0
    ]


def round_failure(error: Exception) -> Exception:
    """What each push of a round that failed on this shard is answered with:
    a request error (`REQUEST_ERRORS`: a refused sum, an empty round) as
    itself, anything else (the update raised) as a fresh `RoundFailedError`
    caused by `error`."""
    if isinstance(error, REQUEST_ERRORS):
        return error
    failed = RoundFailedError(
        f"a server shard's update of the round failed ({bounded_repr(error)}): "
        "nothing of the round was applied on it"
    )
    failed.__cause__ = error
    return failed
