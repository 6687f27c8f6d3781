"""`LocalSgd`: the data-parallel step under `ApplyPolicy.ASYNC` (local SGD).

Each `Step`'s batch goes whole to one replica, which computes its mean
gradient and applies it with its own optimizer (a local step); the trainer
answers the `Step` as soon as the batch is handed over (`applied=False`,
`samples=0`), so the replicas train side by side, each at its own pace: a
replica k times faster takes about k times as many batches, and no replica
waits for another between two rounds. A replica takes the batch when it
would finish it first among those with fewer than `_IN_FLIGHT` batches
queued (its speed is measured, `ReplicaSpeeds`); when every replica has
that many, the `Step` waits for the first to finish one.

Every `average_every` batches, or at the first `Step` that comes
`average_seconds` after the last round, a round closes: the trainer waits
for every batch handed out, then every replica's weights become their mean
(computed on the trainer's host thread; each keeps its optimizer state), so
the replicas are identical after it. That `Step` answers with the round's
loss, samples and the averaging time (`comm_micros`). A local step that
failed (a non-finite gradient, a crashed replica) is answered at the round's
close with its error, the round not averaged; the other replicas' local
steps stand. A batch counts as a step (`max_steps`) when handed out; the
local steps of a failed round that do not stand are uncounted at its close.
`close` ends an open round early (before a checkpoint, an evaluation, the
weights being read); `drain` only waits for the batches handed out (each
replica's own weights read mid-round).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from atomr.accel.serial_worker import SerialWorker
from atomr.actor import Failure
from atomr.train.comm._fanout import failed_indices
from atomr.train.core._step_checks import check_normaliser
from atomr.train.core.stats import StepStats
from atomr.train.data_parallel._replicas import crashed
from atomr.train.data_parallel._step import StepRunner
from atomr.train.data_parallel.messages import ApplyReducedGradients, ComputeGradients
from atomr.train.data_parallel.speed_balancer import ReplicaSpeeds

__all__ = ["LocalSgd"]

_IN_FLIGHT = 2  # batches queued at one replica: it never idles between two Steps


class LocalSgd:
    """Local SGD over a `StepRunner`'s replicas (module docstring).

    Args:
        runner: the trainer's step runner (its replicas, config and step count).
        every: batches between two averaging rounds.
        seconds: also a round once this long has passed since the last (None: never).
        host: the thread the mean is computed on.
        speed_hint: each replica's initial relative speed (None: equal).
        clock: what the batches are timed by (`DataParallelOptions.clock`).
    """

    def __init__(
        self,
        runner: StepRunner,
        every: int,
        seconds: float | None,
        host: SerialWorker,
        speed_hint: tuple[float, ...] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.runner = runner
        self.every = every
        self.seconds = seconds
        self.host = host
        self.speed_hint = speed_hint
        self.clock = clock
        self._speeds = ReplicaSpeeds(speed_hint, 0, clock)
        self._queued: list[list[asyncio.Task[Any]]] = []
        self._round: list[tuple[int, asyncio.Task[Any]]] = []  # (replica, its local step)
        self._assigned: list[int] = []
        self._last_round = time.monotonic()
        self._round_started = time.perf_counter_ns()
        self._samples = 0

    def _fit_replicas(self) -> None:
        """(Re)size the per-replica state to the current replicas."""
        n = len(self.runner.replicas.refs)
        if len(self._queued) == n:
            return
        self._speeds = ReplicaSpeeds(self.speed_hint, n, self.clock)
        self._queued = [[] for _ in range(n)]
        self._assigned = [0] * n

    def _due(self) -> bool:
        """Whether this `Step` closes a round (by batches, or by time)."""
        if len(self._round) >= self.every:
            return True
        return self.seconds is not None and time.monotonic() - self._last_round >= self.seconds

    def _pick(self) -> int:
        """The replica below `_IN_FLIGHT` that would finish one more batch of
        this round first (-1: every replica is full)."""
        best, best_end = -1, float("inf")
        for i, queued in enumerate(self._queued):
            end = (self._assigned[i] + 1) * self._speeds.seconds_per_sample[i]
            if len(queued) < _IN_FLIGHT and end < best_end:
                best, best_end = i, end
        return best

    async def _local_step(
        self, i: int, x: np.ndarray, y: np.ndarray, after: asyncio.Task[Any] | None
    ) -> tuple[float, float, float]:
        """Replica `i`, once its local step `after` is done: the batch's mean
        gradient, applied by its own optimizer (two messages, so two local
        steps of one replica must not interleave).

        Returns:
            `(loss sum, normaliser, gradient norm)`.

        Raises:
            Exception: the replica's failure (its weights unchanged).
        """
        if after is not None:
            await asyncio.wait([after])
        replicas, runner = self.runner.replicas, self.runner
        ref = replicas.refs[i]
        result = await ref.ask(ComputeGradients(x, y), timeout=replicas.timeout)
        check_normaliser(result.normaliser)  # every target of weight 0: nothing to apply
        clip = runner.config.gradient_clip
        apply = ApplyReducedGradients(
            None, scale=1.0 / result.normaliser, clip=clip, token=runner.next_token()
        )
        norm = await ref.ask(apply, timeout=replicas.timeout)
        return float(result.loss_sum), float(result.normaliser), float(norm)

    def _finished(self, i: int, rows: int, dispatched: float, task: asyncio.Task[Any]) -> None:
        """Replica `i` finished a batch of `rows` handed out at `dispatched`: learn its speed."""
        seconds = self._speeds.busy(i, dispatched)
        self._queued[i].remove(task)
        if rows and not task.cancelled() and task.exception() is None and seconds > 0:
            self._speeds.learn({i: seconds / rows})

    async def _dispatch(self, x: np.ndarray, y: np.ndarray) -> None:
        """Hand the batch to a replica, waiting for a free one if all are full."""
        i = self._pick()
        while i < 0:
            await asyncio.wait(
                [t for q in self._queued for t in q], return_when=asyncio.FIRST_COMPLETED
            )
            i = self._pick()
        after = self._queued[i][-1] if self._queued[i] else None
        task = asyncio.ensure_future(self._local_step(i, x, y, after))
        rows, dispatched = int(x.shape[0]), self._speeds.clock()
        task.add_done_callback(lambda t: self._finished(i, rows, dispatched, t))
        self._queued[i].append(task)
        self._round.append((i, task))
        self._assigned[i] += 1

    async def step(self, x: np.ndarray, y: np.ndarray, samples: int) -> StepStats | Failure:
        """Hand this batch to a replica; close the round when it is due.

        Returns:
            `applied=False` stats, or the round's `StepStats` (loss over its
            batches, the mean gradient norm, `comm_micros` the averaging
            time), or the `Failure` of a local step of the round.
        """
        self._fit_replicas()
        if not self._round:
            self._round_started = time.perf_counter_ns()
        await self._dispatch(x, y)
        self.runner.steps += 1
        self._samples += samples
        if not self._due():
            return StepStats(0.0, 0.0, 0, 0, applied=False)
        return await self._close_round()

    async def drain(self) -> None:
        """Wait until every batch handed out has been applied or has failed
        (the round stays open; a failure is answered when it closes)."""
        queued = [t for q in self._queued for t in q]
        if queued:
            await asyncio.wait(queued)

    async def close(self) -> StepStats | Failure | None:
        """Close an open round now: wait for its batches and average.

        Returns:
            None when no batch was handed out since the last round, else as `step`.
        """
        if not self._round:
            return None
        return await self._close_round()

    async def _failed_round(
        self, tasks: list[tuple[int, asyncio.Task[Any]]], results: list[Any]
    ) -> Failure:
        """A round with a failed local step: uncount the local steps that do
        not stand (each failed one, and every one of a replica that crashed:
        its supervisor restarted it, and it is re-synced from a healthy one),
        then repair.

        Returns:
            The `Failure` of the first failing replica (`ReplicaGroup.repair`).
        """
        by_replica: list[Any] = [None] * len(self.runner.replicas.refs)
        for (i, _), result in zip(tasks, results, strict=True):
            if isinstance(result, BaseException) and not crashed(by_replica[i]):
                by_replica[i] = result  # a crash outranks a refusal: it is re-synced
        self.runner.steps -= sum(
            isinstance(result, BaseException) or crashed(by_replica[i])
            for (i, _), result in zip(tasks, results, strict=True)
        )
        return await self.runner.replicas.repair(by_replica, "the round was not averaged")

    async def _close_round(self) -> StepStats | Failure:
        tasks, self._round = self._round, []
        samples, self._samples = self._samples, 0
        self._assigned = [0] * len(self._assigned)
        self._last_round = time.monotonic()
        results = list(await asyncio.gather(*(t for _, t in tasks), return_exceptions=True))
        if failed_indices(results):
            return await self._failed_round(tasks, results)
        steps: list[tuple[float, float, float]] = results  # type: ignore[assignment]  # no errors
        started = time.perf_counter_ns()
        await self.runner.replicas.average_weights(self.host)
        comm = (time.perf_counter_ns() - started) // 1000
        loss = sum(r[0] for r in steps) / sum(r[1] for r in steps)
        norm = float(np.mean([r[2] for r in steps]))
        micros = (time.perf_counter_ns() - self._round_started) // 1000
        return StepStats(float(loss), norm, int(micros), samples, True, int(comm), len(steps))
