"""`PushHolding`: a server shard holds an asynchronous push across several
shards until its client confirms it or rolls it back.

A push across several shards must be kept by every shard or by none
(`ShardedClient`). Each shard applies its range and, as the push asks
(`PushGradient.hold`), holds it: the update stays undoable (`StagedRound`)
and every other message (another worker's push, an abort, a state, a
checkpoint) waits, stashed, until the client, with every shard's answer,
tells `ConfirmPush` or asks `RollbackRound`; a pull is answered at once
with the weights before the held push (`DoubleBuffer.previous`, one version
back). No update lands on top of a push that may be undone and no one
reads weights that may be undone: the pushes of several workers are kept
or undone one at a time, in the order the first shard took them.

A client that gives its push up before every shard answered (its worker
stopped: the client is cancelled) rolls it back on every shard as it goes
(`ShardedClient._give_up`): the holds end at once, and every shard ends
without the push. Every hold has a deadline too (`PushGradient.hold`
seconds; the client gives twice its ask timeout): a client that could not
even do that (its event loop gone) is presumed to have given the push up,
and the shard rolls it back itself (`HoldExpired`, logged). A confirm that
comes after that finds this shard without the push the others kept: the
shard then refuses every push, abort and pull with `RoundFailedError`
until it is given a state.

While a push is held the shard handles only what ends the hold
(`ConfirmPush`, `RollbackRound`, `HoldExpired`), pulls and `Stats`. A shard
restarted while holding lost the push with its state and refuses to serve
anyway (`WorkerStateLost`); the restart cancels its timer and queues what
it had stashed again.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from atomr.actor import Failure
from atomr.train.parameter_server._push_checks import check_round_id, check_worker
from atomr.train.parameter_server._round import RoundFailedError
from atomr.train.parameter_server._shard_store import ShardStore
from atomr.train.parameter_server.messages import ConfirmPush, PullWeights, RollbackRound, Stats

__all__ = ["HoldExpired", "PushHolding"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class HoldExpired:
    """A shard's own timer message: the hold of `worker`'s push of
    `round_id` reached its deadline without a confirm or a rollback."""

    worker: int
    round_id: int


# what a shard holding a push still handles: what ends the hold, pulls, counters
_PASSING = (ConfirmPush, RollbackRound, HoldExpired, PullWeights, Stats)


class PushHolding(ShardStore):
    """A `ShardStore` that holds pushes (module docstring); `ServerShard`
    sets the attributes below in its constructor."""

    n_workers: int | None
    # the (worker, round_id) of the push held now, or None
    _held: tuple[int, int] | None
    # its deadline on the scheduler's clock (inf: none); when the running
    # `HoldExpired` timer falls due (None: no timer runs)
    _held_until: float = math.inf
    _timer_due: float | None = None

    def _waits(self, message: Any) -> bool:
        """While a push is held, put `message` aside (stashed until the hold
        ends) unless it ends the hold, pulls or asks for counters.

        Returns:
            True when it was put aside.
        """
        if self._held is None or isinstance(message, _PASSING):
            return False
        self.context.stash()
        return True

    def _hold(self, worker: int, round_id: int, seconds: float) -> None:
        """Hold `worker`'s push of `round_id`, just applied, for at most
        `seconds` (inf: until its client answers).

        One timer serves the holds one after the other: it is started for
        this hold unless one runs that falls due before this deadline, and
        is left running when a hold ends (`_expire` then starts it again
        for the hold of that time), instead of a timer started and
        cancelled for every push (most end within milliseconds)."""
        self._held = (worker, round_id)
        if not math.isfinite(seconds):
            self._held_until = math.inf
            return
        self._held_until = self.context.system.scheduler.time() + seconds
        if self._timer_due is None or self._held_until < self._timer_due:
            self._start_timer(seconds)

    def _start_timer(self, seconds: float) -> None:
        """Tell `HoldExpired` of the push held now in `seconds` (replacing
        the timer that runs, if any)."""
        assert self._held is not None
        self.context.schedule_once(seconds, HoldExpired(*self._held), key=HoldExpired)
        self._timer_due = self._held_until

    async def _end_hold(self) -> None:
        """The held push is kept or undone: tick its worker's clock (it
        counts as a batch done either way) and handle what waited for it."""
        assert self._held is not None
        worker = self._held[0]
        self._held = None
        self.context.unstash_all()
        await self._batch_done(worker)

    async def _batch_done(self, worker: int) -> None:
        """Tick `worker`'s clock and answer the pulls it frees (`ServerShard`'s)."""
        raise NotImplementedError

    async def _confirm(self, msg: ConfirmPush) -> None:
        """`ConfirmPush`: keep the held push; a confirm of a push whose hold
        expired here (rolled back here, kept by the others) makes the shard
        refuse to serve; any other is stale and ignored."""
        if self._held == (msg.worker, msg.round_id):
            await self._end_hold()
        elif msg.round_id is not None and self._expired.get(msg.worker) == msg.round_id:
            logger.error("server shard: %s", _confirmed_late(msg.worker, msg.round_id)())
            self._refuse(_confirmed_late(msg.worker, msg.round_id))

    async def _expire(self, msg: HoldExpired) -> None:
        """`HoldExpired`: no confirm came in time; roll the held push back
        (its client is presumed dead) and handle what waited. If the hold it
        was timed for ended, the push held now (if any) is rolled back if
        its own deadline has come too, else timed for it.

        Raises:
            Exception: the device's failure undoing it (the shard then
                refuses to serve, and its supervisor resumes or restarts it).
        """
        self._timer_due = None
        if self._held is None:
            return
        left = self._held_until - self.context.system.scheduler.time()
        if self._held != (msg.worker, msg.round_id) and left > 0.0:  # that hold ended
            if math.isfinite(left):
                self._start_timer(left)
            return
        worker, round_id = self._held
        logger.warning(
            "server shard: worker %s's push of round %s was neither confirmed nor rolled "
            "back by its client in time: rolled back here",
            worker,
            round_id,
        )
        self._expired[worker] = round_id
        try:
            await self._roll_back_round((round_id,), worker)
        except BaseException:
            self._refuse(_confirmed_late(worker, round_id))  # undone or not: unknown
            raise
        finally:
            await self._end_hold()

    async def _roll_back(self, msg: RollbackRound) -> Any:
        """`RollbackRound`: undo the last update if it holds the failed round
        (or the worker's failed push), ending its hold; see
        `ShardStore._roll_back_round`."""
        try:
            rounds = tuple(check_round_id(r) for r in msg.round_ids)
            worker = None if msg.worker is None else check_worker(msg.worker, self.n_workers)
        except (TypeError, ValueError) as exc:
            return Failure(TypeError(f"RollbackRound needs round ids and a worker id: {exc}"))
        try:
            undone = await self._roll_back_round(rounds, worker)
        except RoundFailedError as exc:  # held for good: the shard now refuses
            return Failure(exc)
        held = self._held
        if held is not None and held[0] == worker and held[1] in rounds:
            await self._end_hold()
        elif worker is not None and not undone:  # a push of it may come yet: never applied
            fresh = [(worker, r) for r in rounds if not self._accepted.taken(worker, r)]
            if fresh:  # an aborted batch, for the clocks (its AbortPush is then taken)
                self._accepted.take(fresh)
                await self._batch_done(worker)
        return undone


def _confirmed_late(worker: int, round_id: int) -> Callable[[], Exception]:
    """What a shard refuses with once it was told to keep `worker`'s push of
    `round_id` after it had rolled it back (its hold expired)."""

    def error() -> Exception:
        return RoundFailedError(
            f"this server shard rolled worker {worker}'s push of round {round_id} back when "
            "its hold expired, but its client then confirmed it (the other shards kept it): "
            "the shards hold a model mixed from two versions, so it refuses to serve until "
            "a checkpoint is loaded (LoadCheckpoint, or SetServerState)"
        )

    return error
