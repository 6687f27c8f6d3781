"""`Cadence`: the data-parallel step under `ApplyPolicy.CADENCE` (flodl's El Che).

A round spans several `Step` messages. Each `Step`'s batch goes whole to one
replica: first one to each replica, the slowest first, then to the one that
would finish it first among those below their quota;
the replica adds its gradient to its buffer (`accumulate`) while the trainer
answers the `Step` at once (`applied=False`, `samples=0`), so the replicas
compute side by side. The slowest replica's quota is the *anchor*; a replica
k times faster gets k times as many batches. When every quota is met, the
buffers are reduced (weighted by what each saw: the sum of the loss-sum
gradients over the total normaliser, i.e. the mean gradient of every sample
of the round) and applied once; that `Step` answers with the round's loss
and samples. The speeds are measured per round (smoothed): a replica's time
on each of its batches, as ASYNC times them (`ReplicaSpeeds.busy`: not the
time it waited for a batch), over its samples. With
`cadence_auto_tune` the anchor grows while the reduction takes more than
`cadence_target` of a round, and shrinks below half of it.
The speeds start as `speed_hint`'s ratio; the first measurement puts every
replica's in seconds, so one that got no batch in a round keeps its ratio.
Without `cadence_measure_speeds` the quotas keep the hint's ratio.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

import numpy as np

from atomr.actor import Failure
from atomr.train.comm._fanout import failed_indices
from atomr.train.core.stats import StepStats
from atomr.train.data_parallel._step import StepRunner
from atomr.train.data_parallel.messages import (
    ComputeGradients,
    GetGradients,
    GradientResult,
    SetGradients,
)
from atomr.train.data_parallel.options import DataParallelOptions
from atomr.train.data_parallel.speed_balancer import ReplicaSpeeds, round_quotas

__all__ = ["Cadence"]

_MAX_ANCHOR = 64


class Cadence:
    """Rounds of El Che over a `StepRunner`'s replicas (module docstring).

    Attributes:
        anchor: the slowest replica's batches per round.
        quotas: each replica's batches in the current round.
        last_share: the reduction's share of the last round's time.
    """

    def __init__(self, runner: StepRunner, options: DataParallelOptions) -> None:
        self.runner = runner
        self.options = options
        self.anchor = options.cadence_anchor
        self.speeds: ReplicaSpeeds | None = None
        self.quotas: list[int] = []
        self._busy: list[float] = []  # each replica's seconds on its batches this round
        self.last_share = 0.0
        self._pending: list[list[asyncio.Task[Any]]] = []
        self._samples = 0
        self._started = 0

    def _open_round(self) -> None:
        n = len(self.runner.replicas.refs)
        if self.speeds is None or len(self.speeds.seconds_per_sample) != n:
            self.speeds = ReplicaSpeeds(self.options.speed_hint, n, self.options.clock)
        spp = self.speeds.seconds_per_sample
        self.quotas = [max(1, round(q)) for q in round_quotas(self.anchor, spp)]
        self._pending = [[] for _ in range(n)]
        self._busy = [0.0] * n
        self._samples = 0
        self._started = time.perf_counter_ns()

    def _pick(self) -> int:
        """A replica without a batch in this round yet, the slowest first (its
        work is what the round waits for, and a round closed early has then
        measured it); once each has one, the replica below its quota that
        would finish one more batch first."""
        assert self.speeds is not None
        spp = self.speeds.seconds_per_sample
        idle = [i for i, pending in enumerate(self._pending) if not pending]
        if idle:
            return max(idle, key=lambda i: spp[i])
        best, best_end = -1, float("inf")
        for i, quota in enumerate(self.quotas):
            done = len(self._pending[i])
            if done < quota and (done + 1) * spp[i] < best_end:
                best, best_end = i, (done + 1) * spp[i]
        return best

    async def step(self, x: np.ndarray, y: np.ndarray, samples: int) -> StepStats | Failure:
        """Give this batch to a replica; close the round when every quota is met."""
        if not self._pending or all(not p for p in self._pending):
            self._open_round()
        replicas, speeds = self.runner.replicas, self.speeds
        assert speeds is not None
        i = self._pick()
        k = len(self._pending[i])
        last = k + 1 == self.quotas[i]
        message = ComputeGradients(x, y, k > 0, last and self.runner.reduction.wants_gradients)
        busy, dispatched = self._busy, speeds.clock()
        task = asyncio.ensure_future(replicas.refs[i].ask(message, timeout=replicas.timeout))

        def timed(done: asyncio.Task[Any]) -> None:
            busy[i] += speeds.busy(i, dispatched)
            if not done.cancelled():
                # read: a round never closed (the trainer stopped) leaves no
                # failure unretrieved; a closing round reads it again
                done.exception()

        task.add_done_callback(timed)
        self._pending[i].append(task)
        self._samples += samples
        if sum(map(len, self._pending)) < sum(self.quotas):
            return StepStats(0.0, 0.0, 0, 0, applied=False)
        return await self._close_round()

    async def close(self) -> StepStats | Failure | None:
        """Close an open round now (a checkpoint holds every batch it was given):
        its batches so far are reduced and applied as one shorter round."""
        if not self._pending or all(not p for p in self._pending):
            return None
        self.quotas = [len(p) for p in self._pending]
        return await self._close_round()

    async def _close_round(self) -> StepStats | Failure:
        pending, self._pending = self._pending, []
        per_replica = await asyncio.gather(
            *(asyncio.gather(*tasks, return_exceptions=True) for tasks in pending)
        )
        outcome = [
            next((r for r in rs if isinstance(r, BaseException)), None) for rs in per_replica
        ]
        if failed_indices(outcome):
            return await self.runner.replicas.repair(outcome, "the round was not applied")
        results: list[list[GradientResult]] = per_replica  # type: ignore[assignment]  # no errors
        await self._complete(results)
        if self.options.cadence_measure_speeds:
            self._learn_speeds(results)
        loss_sum = sum(r.loss_sum for rs in results for r in rs)
        normaliser = sum(r.normaliser for rs in results for r in rs)
        reduce_started = time.perf_counter_ns()
        reduced = await self.runner.reduction.reduce(
            [rs[-1] for rs in results], loss_sum, normaliser
        )
        if isinstance(reduced, Failure):
            return reduced
        comm = (time.perf_counter_ns() - reduce_started) // 1000
        stats = await self.runner.apply(reduced, self._samples, self._started, int(comm))
        if isinstance(stats, StepStats):
            self._tune(stats)
        return stats

    async def _complete(self, results: list[list[GradientResult]]) -> None:
        """A round closed early (a checkpoint): a replica that got no batch
        contributes a zeroed buffer, and one whose last batch was not its last
        planned one hands its buffer over now."""
        replicas = self.runner.replicas
        wants = self.runner.reduction.wants_gradients
        dtype = np.dtype(replicas.model.get("dtype", "float32"))
        for i, rs in enumerate(results):
            if not rs:
                zeros = np.zeros(replicas.n_params, dtype=dtype)
                await replicas.refs[i].ask(SetGradients(zeros), timeout=replicas.timeout)
                results[i] = [GradientResult(0.0, 0.0, 0, 0, zeros if wants else None)]
            elif wants and rs[-1].gradients is None:
                held = await replicas.refs[i].ask(GetGradients(), timeout=replicas.timeout)
                rs[-1] = replace(rs[-1], gradients=np.asarray(held))

    def _learn_speeds(self, results: list[list[GradientResult]]) -> None:
        assert self.speeds is not None
        measured: dict[int, float] = {}
        for i, rs in enumerate(results):
            rows = sum(r.samples for r in rs)
            if rows and self._busy[i] > 0:
                measured[i] = self._busy[i] / rows
        self.speeds.learn(measured)

    def _tune(self, stats: StepStats) -> None:
        share = stats.comm_micros / stats.step_micros if stats.step_micros else 0.0
        self.last_share = share
        if not self.options.cadence_auto_tune:
            return
        target = self.options.cadence_target
        if share > target and self.anchor < _MAX_ANCHOR:
            self.anchor += 1
        elif share < target / 2 and self.anchor > 1:
            self.anchor -= 1
