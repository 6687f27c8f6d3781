"""`WorkerPool`: how the trainer drives its workers.

A global batch is split into one part per worker (`split_among`). Each
worker is asked to `TrainBatch` its part; a worker that fails on it is
restarted (or resumed) by its supervisor, the trainer, and the same part is
sent again, up to `max_retries` times. Bad requests are never sent again.
Every worker's answer is awaited before a failure is raised, so no part of
a failed request is still running when the asker hears of it. A worker that
gave up on its part without answering it (it failed past its retries, or
was stopped) is withdrawn from the servers' round on its behalf
(`AbortPush`), as a worker does itself for a batch it cannot push: a
synchronous round is dropped at once instead of holding the other workers'
pushes until their timeout (and then mixing them into the next step), and a
bounded-staleness clock still counts the batch.

Every part names its round (`TrainBatch.round_id`: one per global batch), so
that a part sent again after its push landed (its worker failed before
answering) is not applied twice: the shards take one push per worker and
round. A synchronous request that fails has its failed rounds rolled back
on every server shard (`RollbackRound`, `_round.roll_back`): a round is
kept by every shard or by none, and a round that failed on a shard
(`RoundFailedError`) is not sent again; nor is a part answered with
`WorkerStateLost` (a server shard restarted, which refuses to serve until
a checkpoint is loaded).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from atomr.actor import ActorRef, ActorStoppedError, AskTimeoutError
from atomr.actor.errors import bounded_repr
from atomr.train.comm._fanout import ask_all, fence, raise_first_failure
from atomr.train.core.device_guard import REQUEST_ERRORS
from atomr.train.core.errors import InvalidBatchError, WorkerStateLost
from atomr.train.core.partition import split_bounds
from atomr.train.core.stats import StepStats
from atomr.train.parameter_server._round import RoundDroppedError, RoundFailedError, roll_back
from atomr.train.parameter_server.consistency import Consistency
from atomr.train.parameter_server.messages import (
    AbortPush,
    BatchResult,
    RollbackRound,
    StaleGradientError,
    Stats,
    TrainBatch,
)

__all__ = ["WorkerPool", "combine", "split_among"]

# errors that mean "the request was bad" (or the worker is gone): never sent
# again. Not `device_guard.REQUEST_ERRORS`: it holds OSError (for checkpoint
# files).
_NOT_RETRIED: tuple[type[Exception], ...] = (
    ActorStoppedError,
    InvalidBatchError,
    FloatingPointError,  # NonFiniteError included
    StaleGradientError,
    RoundFailedError,  # a copy would compute from weights some shards moved on from
    WorkerStateLost,  # a server shard refuses to serve until a checkpoint is loaded
)

# the worker answers these itself, after withdrawing from the round (or the
# round is over); a timed out worker may still push: no `AbortPush` on its
# behalf after any of them
_ANSWERED_OR_LATE: tuple[type[Exception], ...] = (
    AskTimeoutError,
    RoundFailedError,
    *REQUEST_ERRORS,
)

Part = tuple[np.ndarray, np.ndarray]


def split_among(x: np.ndarray, y: np.ndarray, workers: int) -> list[Part]:
    """Split a batch into `workers` parts (`split_bounds`: uneven parts
    allowed, the first ones one row longer; a part may be empty)."""
    return [(x[lo:hi], y[lo:hi]) for lo, hi in split_bounds(len(x), workers)]


def combine(results: Sequence[BatchResult], synchronous: bool) -> StepStats:
    """One `StepStats` for a global batch from its parts' results.

    `loss` is the parts' losses weighted by their loss normalisers (their
    sample counts for an unweighted loss), which is the whole batch's mean
    loss; `grad_norm` is the parts' gradient norms weighted the same way:
    by the triangle inequality an upper bound of the norm of the averaged
    gradient a synchronous round applies, equal to it with one worker;
    `step_micros` is the slowest part's; `samples` their sum; `applied`
    whether any part pushed a gradient; `updates` the server's: one per part
    pushed, or one round when `synchronous`.
    """
    pushed = sum(r.stats.applied for r in results)
    total = sum(r.normaliser for r in results)
    scale = 1.0 / total if total > 0.0 else 0.0
    return StepStats(
        float(sum(r.stats.loss * r.normaliser for r in results) * scale),
        float(sum(r.stats.grad_norm * r.normaliser for r in results) * scale),
        max((r.stats.step_micros for r in results), default=0),
        sum(r.stats.samples for r in results),
        applied=pushed > 0,
        updates=min(pushed, 1) if synchronous else pushed,
    )


class WorkerPool:
    """The trainer's workers.

    A worker may start a batch from the weights its previous push returned
    instead of pulling (`TrainBatch.reuse_generation`) where that is exactly
    what a pull would give: in synchronous mode (the weights stay as the round
    left them until every worker has pushed again), until the trainer says the
    weights changed otherwise (`weights_changed`). In the asynchronous and
    bounded models every batch pulls: there the push's answer can be older
    than a pull, and the extra staleness made training worse.

    Args:
        refs: the worker actors (worker ids are their indices).
        max_retries: how many times one request is sent again to a worker
            that failed on it.
        timeout: each ask's timeout in seconds (None: wait forever).
        consistency: the servers' consistency model.
        servers: the server shards, where a worker that gave up on its part
            is withdrawn from the round on its behalf (none: not withdrawn).

    Attributes:
        retries: requests sent again so far.
    """

    def __init__(
        self,
        refs: Sequence[ActorRef],
        max_retries: int,
        timeout: float | None,
        consistency: Consistency | None = None,
        servers: Sequence[ActorRef] = (),
    ) -> None:
        self.refs = list(refs)
        self.servers = list(servers)
        self.max_retries = max_retries
        self.timeout = timeout
        self.retries = 0
        self.consistency = consistency or Consistency.asynchronous()
        self._generation = 0
        self._next_round = 0

    def weights_changed(self) -> None:
        """The servers' weights were replaced (a checkpoint): no worker may
        start from weights it was given before."""
        self._generation += 1

    def _rounds(self, count: int) -> int:
        """The first of `count` fresh round ids (`TrainBatch.round_id`)."""
        first = self._next_round
        self._next_round += count
        return first

    def _reuse(self) -> int | None:
        """The `reuse_generation` of the batches (None: pull)."""
        return self._generation if self.consistency.is_synchronous else None

    def __len__(self) -> int:
        return len(self.refs)

    async def ask(self, index: int, message: Any) -> Any:
        """Ask worker `index`, sending again (up to `max_retries` times) after
        it failed on the message.

        Raises:
            Exception: a bad request or a stopped worker at once; any other
                failure once the retries are spent. In synchronous mode, a
                part the worker answered with a request error
                (`REQUEST_ERRORS`) at once too: the worker withdrew from the
                round, which is dropped, so a second copy would push into a
                round of its own.
        """
        final = _NOT_RETRIED
        if self.consistency.is_synchronous and isinstance(message, TrainBatch):
            final = (*_NOT_RETRIED, *REQUEST_ERRORS)
        for attempt in range(self.max_retries + 1):
            try:
                return await self.refs[index].ask(message, timeout=self.timeout)
            except AskTimeoutError:
                # not sent again: the worker may still be on the part, and a
                # second copy would push its gradient twice. Wait (at most the
                # timeout again) until it is done, so that its late push lands
                # in this step's round and the next step starts in step; one
                # still busy past that is left to its supervisor.
                await fence([self.refs[index]], self.timeout)
                raise
            except final:
                raise
            except Exception:
                if attempt == self.max_retries:
                    raise
                self.retries += 1
        raise AssertionError("unreachable")

    async def train(self, parts: Sequence[Part]) -> list[BatchResult]:
        """Every worker trains its part at once.

        Returns:
            One `BatchResult` per worker.

        Raises:
            Exception: the first failure in worker order, once every worker
                answered (and, synchronous, the round was rolled back: `_settle`).
        """
        asks, offset, reuse, lost, failed = [], 0, self._reuse(), set[int](), set[int]()
        round_id = self._rounds(1)
        for i, (x, y) in enumerate(parts):
            batch = TrainBatch(x, y, offset, reuse, round_id)
            asks.append(self._train_part(i, batch, lost, failed))
            offset += len(x)
        results = await asyncio.gather(*asks, return_exceptions=True)
        await self._settle(results, lost, failed)
        return [r for r in results if not isinstance(r, BaseException)]

    async def _train_part(
        self, index: int, message: TrainBatch, lost: set[int], failed: set[int]
    ) -> BatchResult:
        """`ask` worker `index` to train a part; if it fails, note its round in
        `failed`; if it gives up on it without answering (out of retries,
        stopped), withdraw it from the servers' round (`_withdraw`) and note
        it in `lost`.

        Raises:
            Exception: as `ask`.
        """
        try:
            result: BatchResult = await self.ask(index, message)
            return result
        except Exception as exc:
            if message.round_id is not None:
                failed.add(message.round_id)
            if not isinstance(exc, _ANSWERED_OR_LATE):
                lost.add(index)
                await self._withdraw(index, exc, message.round_id)
            raise

    async def _settle(self, results: Sequence[Any], lost: set[int], failed: set[int]) -> None:
        """Raise the request's root failure (`_raise_root_failure`), if any;
        in synchronous mode after its `failed` rounds were rolled back on
        every server shard (`_roll_back`).

        Raises:
            BaseException: that failure, noting what the rollback did.
        """
        try:
            _raise_root_failure(results, lost)
        except BaseException as error:
            if self.consistency.is_synchronous and failed and self.servers:
                await self._roll_back(failed, error)
            raise

    async def _roll_back(self, rounds: set[int], error: BaseException) -> None:
        """`RollbackRound(rounds)` on every server shard, so that a shard that
        applied a round that failed elsewhere undoes it; the workers' weights
        from those rounds are not reused (`weights_changed`). Notes on `error`
        what was undone, or which shards could not be asked (the model may
        then be inconsistent: a synchronous worker refuses shards at
        different versions, to train or evaluate, `RoundFailedError`, until a
        checkpoint is loaded)."""
        self.weights_changed()
        message = RollbackRound(tuple(sorted(rounds)))
        await roll_back(self.servers, message, self.timeout, error, "round")

    async def _withdraw(self, index: int, error: Exception, round_id: int | None) -> None:
        """`AbortPush` on behalf of worker `index` at the servers' current
        versions: the synchronous round it did not push in is dropped (every
        push of it fails), a bounded-staleness clock counts its batch. Waits
        for the round's end; its outcome is the other workers' to report."""
        if not self.servers:
            return
        reason = f"gave up on its part: {bounded_repr(error)}"
        with contextlib.suppress(Exception):
            stats = await ask_all(self.servers, Stats(), self.timeout, per_worker=False)
            aborts = [AbortPush(index, int(st.version), reason, round_id) for st in stats]
            await ask_all(self.servers, aborts, self.timeout)

    async def train_in_order(self, parts: Sequence[Sequence[Part]]) -> list[BatchResult]:
        """Every worker trains its own list of parts, one after the other, at
        its own pace (nothing but the consistency model holds a worker back).

        Args:
            parts: one list of parts per worker.

        Returns:
            Every part's result.

        Raises:
            Exception: the first failure in worker order. Once a worker failed,
                every other one stops after its current part, and the failure
                is raised once all have stopped (none waits for a stopped one).
        """
        stop, reuse, lost, failed = asyncio.Event(), self._reuse(), set[int](), set[int]()
        first = self._rounds(max((len(own) for own in parts), default=0))
        results = await asyncio.gather(
            *(
                self._train_each(i, own, first, stop, reuse, (lost, failed))
                for i, own in enumerate(parts)
            ),
            return_exceptions=True,
        )
        await self._settle(results, lost, failed)
        return [r for own in results if not isinstance(own, BaseException) for r in own]

    async def _train_each(
        self,
        index: int,
        parts: Sequence[Part],
        first_round: int,
        stop: asyncio.Event,
        reuse: int | None,
        noted: tuple[set[int], set[int]],
    ) -> list[BatchResult]:
        """Worker `index`'s parts in order (the j-th of round `first_round + j`),
        until one fails or `stop` is set (`noted`: `_train_part`'s `lost`, `failed`)."""
        done: list[BatchResult] = []
        for j, (x, y) in enumerate(parts):
            if stop.is_set():
                break
            batch = TrainBatch(x, y, 0, reuse, first_round + j)
            try:
                done.append(await self._train_part(index, batch, *noted))
            except BaseException:
                stop.set()
                raise
        return done


def _raise_root_failure(results: Sequence[Any], lost: set[int]) -> None:
    """Raise the root cause of a failed request: the failure of the first
    worker that gave up on its part, else the first failure in worker order
    that is a worker's own (a `RoundDroppedError` follows from another
    worker's abort, which answered its own error), else the first failure;
    nothing when every part succeeded.

    Raises:
        BaseException: that failure, its own type, naming its worker.
    """
    for index in sorted(lost):
        raise_first_failure([results[index]], first_index=index)
    own = [None if isinstance(r, RoundDroppedError) else r for r in results]
    raise_first_failure(own)
    raise_first_failure(list(results))
