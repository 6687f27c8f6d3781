"""`SynchronousRound`: the pushes a synchronous server shard holds until every
worker has pushed for the current version.

A round holds one entry per worker: a gradient (`PushGradient`) or an abort
(`AbortPush`, a worker without a usable gradient: the round is dropped, every
push of it failing with `RoundDroppedError`). A worker restarted
mid-round pushes again: its newer push replaces the older one, whose asker
is told it was superseded. Once the round is full, `round_update` turns it
into the weighted parts to apply, or the error that every push of it gets.

Pushes name the trainer's round (`PushGradient.round_id`, increasing), and
the latest round named is the current one: a push or abort of an earlier
round (late: its part timed out and the trainer went on) is dropped, never
applied, and a push of a later round ends the entries of earlier rounds
still waiting, so that one update never mixes two rounds' gradients. A
round once full is over too: a push or abort naming it again (a part sent
again after its round was dropped, or a trainer withdrawing a worker from
it) is dropped, instead of opening the round anew to wait for workers that
are done with it. All are answered with `RoundFailedError` and logged.

An applied update stays undoable (`StagedRound`) until the shard's next
update: a synchronous round failing on another shard, or an asynchronous
push failing on another shard (its range of a sharded push), is undone on
every shard that applied it (`RollbackRound`, sent by `roll_back`); a round
whose update fails on a shard is answered with `RoundFailedError` there.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from atomr.actor import ActorRef, Reply
from atomr.actor.errors import bounded_repr
from atomr.train.comm._fanout import ask_all_settled, failed_indices
from atomr.train.core._step_checks import check_normaliser
from atomr.train.core.device_guard import REQUEST_ERRORS
from atomr.train.core.errors import NonFiniteError
from atomr.train.parameter_server.messages import RollbackRound, StaleGradientError

__all__ = [
    "PendingPush",
    "RoundDroppedError",
    "RoundFailedError",
    "StagedRound",
    "SynchronousRound",
    "roll_back",
    "round_failure",
    "round_update",
]

logger = logging.getLogger(__name__)


class RoundDroppedError(NonFiniteError):
    """A synchronous round was dropped because another worker aborted it (it
    had no usable gradient, or gave up on its part): every push of the round
    fails with this, naming the aborting workers. It follows from that
    worker's own failure, which is what a trainer's request reports."""


class RoundFailedError(RuntimeError):
    """A round, or a sharded push, failed on a server shard and was not kept.

    - Synchronous: the round's update raised on a shard (the error is this
      one's `__cause__`), so that shard applied nothing of it, or a worker
      found the shards at different versions (a round applied on some of
      them only). The trainer then rolls the round back on every shard
      (`RollbackRound`): a request answered with it applied nothing (its
      notes say so, or name a shard that could not be rolled back).
    - Asynchronous, several shards: a follower shard failed on its range of
      a push (the error is the `__cause__`) that other shards had applied
      and held; they undid it (`RollbackRound` naming the worker; the notes
      say so, or name a shard that could not be asked). A shard that holds
      half of a push (it undid one the others kept, or could not undo one)
      refuses every push, pull and abort with this error until it is given
      a state.
    - A push or abort of a round that is over (late), or of a round ended by
      a later one, dropped without being applied.

    It is not sent to the workers again: a copy of the part would be
    computed from weights some shards had already moved on from."""


@dataclass(frozen=True)
class StagedRound:
    """A shard's last update (a synchronous round, or one asynchronous push),
    applied but still undoable.

    Attributes:
        pushes: `(worker, round_id)` of its pushes (`PushGradient.round_id`;
            pushes without a round cannot be named, so not undone).
        taken_before: what `AcceptedRounds.take` returned when its pushes
            were taken, restored if it is undone; None: its pushes stay
            taken (an asynchronous push undone counts as an aborted batch:
            its worker's clock ticked, a copy of it applies nothing).
        counters_before: the shard's `(applied, staleness sum, max staleness
            seen)` before it, restored if it is undone.
    """

    pushes: frozenset[tuple[int, int]]
    taken_before: dict[int, int | None] | None
    counters_before: tuple[int, int, int]

    def holds(self, round_ids: Sequence[int | None], worker: int | None = None) -> bool:
        """True when it holds a push of one of `round_ids` (of `worker` only,
        unless None)."""
        return any(r in round_ids and worker in (None, w) for w, r in self.pushes)


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
        self.round_id: int | None = None  # the latest trainer round named: the current one
        self._over: int | None = None  # the latest trainer round that was full

    @property
    def in_progress(self) -> bool:
        """True while some worker's push waits for the others."""
        return bool(self._entries)

    def join(self, worker: int, entry: PendingPush) -> list[tuple[int, PendingPush]] | None:
        """Add `worker`'s push; a push of the same worker already in the round
        is replaced (its asker gets a `StaleGradientError`). A push of a round
        before the current one, or of one that was full already, is answered
        with `RoundFailedError` and not added; one of a later round first
        ends the entries of earlier rounds (each answered with
        `RoundFailedError`). Pushes without a round (`round_id` None) are
        never late and never ended so.

        Returns:
            The full round in worker order (the round starts empty again), or
            None while some worker has not pushed (or the push was late).
        """
        if not self._current(worker, entry):
            return None
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
        if entry.round_id is not None:  # its entries' round: over, whatever comes of it
            self._over = entry.round_id
        return ordered

    def _current(self, worker: int, entry: PendingPush) -> bool:
        """False when `entry` is of a round before the current one, or of one
        that was full already (it is answered and dropped); a later round
        becomes the current one, and the entries of earlier rounds are
        answered and dropped."""
        round_id, current = entry.round_id, self.round_id
        if round_id is None:
            return True
        if round_id == self._over:
            _drop_late(worker, entry, f"round {round_id} was over (full)")
            return False
        if current is not None and round_id < current:
            _drop_late(worker, entry, f"round {current} started")
            return False
        if current is None or round_id > current:
            self.round_id = round_id
            for other, waiting in list(self._entries.items()):
                if waiting.round_id is not None and waiting.round_id < round_id:
                    del self._entries[other]
                    _drop_late(other, waiting, f"round {round_id} started")
        return True


def _drop_late(worker: int, entry: PendingPush, after: str) -> None:
    """Answer the push (or abort) `entry`, which came after `after` (the
    round it names is over), with `RoundFailedError`, and log it: it is
    dropped, never applied."""
    what = "abort" if entry.abort is not None else "push"
    text = (
        f"worker {worker}'s {what} of round {entry.round_id} came after {after} "
        "(its part timed out or was sent again, or its round was left behind): dropped, "
        "nothing of it applied"
    )
    logger.warning("server shard: %s", text)
    entry.reply.set_exception(RoundFailedError(text))


def round_update(ordered: list[tuple[int, PendingPush]]) -> list[tuple[np.ndarray, float]]:
    """The parts a full round applies: each gradient with its weight's share
    of the round's total (`sum(w_i g_i) / sum(w_i)`); empty batches add nothing.

    Args:
        ordered: the round, from `SynchronousRound.join`.

    Returns:
        `(gradient, coefficient)` pairs.

    Raises:
        RoundDroppedError: the round holds an abort (naming every aborting worker).
        InvalidBatchError: the round's weights sum to 0: every target of the
            batch has class weight 0 (`check_normaliser`, as a `Trainer`
            refuses such a Step; nothing is applied).
    """
    aborts = [f"worker {w}: {p.abort}" for w, p in ordered if p.abort is not None]
    if aborts:
        raise RoundDroppedError("; ".join(aborts) + " (the whole round was dropped)")
    total = sum(p.weight for _, p in ordered)
    check_normaliser(total)
    return [
        (p.gradient, p.weight / total)
        for _, p in ordered
        if p.gradient is not None and p.weight > 0.0
    ]


def round_failure(error: Exception) -> Exception:
    """What each push of a round that failed on this shard is answered with:
    a request error (`REQUEST_ERRORS`: a refused sum, a round of weight 0) as
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


async def roll_back(
    servers: Sequence[ActorRef],
    message: RollbackRound,
    timeout: float | None,
    error: BaseException,
    what: str,
) -> list[int]:
    """Ask every server shard to undo `message`'s round (or push) and note on
    `error` what came of it: the shards that undid it (nothing of it is then
    applied on any shard), or those that could not, whose state may hold it
    where the others' do not (a load of a checkpoint is then needed). The
    one way a trainer (a failed synchronous round) and a sharded client (a
    push that failed on a follower shard) undo an update.

    Args:
        servers: every server shard, in range order.
        message: the `RollbackRound`.
        timeout: each ask's timeout in seconds (None: wait forever).
        error: the failure that is being answered, noted.
        what: what is undone, for the note ("round", "push").

    Returns:
        The shards that could not undo it (failed, or could not be asked).
    """
    replies = await ask_all_settled(servers, message, timeout, per_worker=False)
    unknown = failed_indices(replies)
    undone = [k for k, r in enumerate(replies) if r is True]
    if unknown:
        error.add_note(
            f"server shards {unknown} could not undo the failed {what} "
            f"({bounded_repr(replies[unknown[0]])}): they may hold it where the others do "
            "not; load a checkpoint"
        )
    elif undone:
        error.add_note(
            f"server shards {undone} rolled the failed {what} back: nothing of it is applied "
            "on any shard"
        )
    return unknown
