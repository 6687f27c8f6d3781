"""The trainer's side of a sharded step and of an evaluation.

A step is atomic: phase 1 (forward, loss, backward, reduce-scatter) writes
no piece anywhere; phase 2 (`_update.ShardedUpdate`) updates every
replica's piece, kept by every replica of every process or by none.

In a job, a replica failing in phase 1 on one process does not end the
step there alone: that process stops asking its replicas but still joins
every collective the step has left, with zeros (`_Failure`), so no process
waits at one; the sum of the step's totals carries which processes failed,
and every process then ends the step (nothing applied anywhere), the
failing one with its replica's own error, the others with a `RuntimeError`
naming its rank. The next step runs the same collectives everywhere. A
stage 3 evaluation's forward fails the same way, then the processes agree
(`agree_on_failure`) and every process ends it.

Stages 1 and 2 compute each replica's whole gradient in one message and
reduce-scatter the whole vector. Stage 3 gathers each layer before its
forward and again before its backward (`ShardLayerParams` + all-gather),
and reduce-scatters each layer's gradient as soon as the layer's backward
is done.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from atomr.accel.serial_worker import SerialWorker
from atomr.actor import ActorRef
from atomr.train.comm._fanout import ask_all
from atomr.train.comm.agreement import agree_on_failure
from atomr.train.core._step_checks import check_gradient, check_loss, check_normaliser
from atomr.train.core.clip import clip_coefficient
from atomr.train.core.config import TrainerConfig
from atomr.train.core.errors import OtherProcessFailed
from atomr.train.core.partition import split_bounds
from atomr.train.core.stats import StepStats
from atomr.train.sharded._exchange import ShardExchange
from atomr.train.sharded._update import ShardedUpdate
from atomr.train.sharded.messages import (
    BackwardLayer,
    ComputeShardGradients,
    ForwardLayer,
    Handed,
    LayerForwardResult,
    ShardGradients,
    ShardLayerParams,
)

__all__ = ["ShardedPasses"]


@dataclass
class _Reduced:
    """Phase 1's outcome: totals, the owned squared norm, and what each replica
    is sent with its `ApplyShard` (None: its handed buffer was reduced in place)."""

    loss_sum: float
    normaliser: float
    squared: float
    reduced_for: list[np.ndarray | None]


@dataclass
class _Failure:
    """Phase 1's first local failure. Where the step `owes` the other
    processes its collectives (a job), a failure does not end it here: no
    replica is asked anything more, and the step's remaining collectives get
    zeros (module docstring)."""

    owes: bool
    error: Exception | None = None

    async def ask(
        self, ask: Callable[[list[Any]], Awaitable[list[Any]]], messages: list[Any]
    ) -> list[Any] | None:
        """`ask(messages)`, or None once this step failed here.

        Raises:
            Exception: the replicas' error, where the step owes nothing.
        """
        if self.error is not None:
            return None
        try:
            return await ask(messages)
        except Exception as exc:
            if not self.owes:
                raise
            self.error = exc
            return None


class ShardedPasses:
    """Runs steps and evaluations over a trainer's replicas.

    Args:
        config: the trainer's config (loss, clipping, deadline).
        stage: the ZeRO stage.
        exchange: the collectives over the layout.
        refs: the local replicas, in order.
        host: the thread for the host-side norms.
        dtype: the parameters' dtype (of the zeros a failed process contributes).
    """

    def __init__(
        self,
        config: TrainerConfig,
        stage: int,
        exchange: ShardExchange,
        refs: list[ActorRef],
        host: SerialWorker,
        dtype: Any,
    ) -> None:
        self.config = config
        self.dtype = dtype
        self.stage = stage
        self.exchange = exchange
        self.refs = refs
        self.host = host
        self.timeout = config.worker_timeout
        self.update = ShardedUpdate(stage, exchange, refs, self.timeout)

    def shards(self, x: np.ndarray, y: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """One contiguous part of the rows per local replica."""
        return [(x[lo:hi], y[lo:hi]) for lo, hi in split_bounds(int(x.shape[0]), len(self.refs))]

    async def _ask(self, messages: list[Any]) -> list[Any]:
        return await ask_all(self.refs, messages, self.timeout)

    async def step(self, x: np.ndarray, y: np.ndarray, samples: int, offset: int = 0) -> StepStats:
        """One step on this process's rows (module docstring); `offset`: the
        index of `x`'s first row in the whole batch.

        Raises:
            NonFiniteError, ValueError: a non-finite loss or gradient, or a
                zero normaliser (nothing applied).
            Exception: the first failing replica's own error (nothing applied).
            OtherProcessFailed: only another process's replica failed (nothing
                applied anywhere; the message names its rank).
        """
        t0 = time.perf_counter_ns()
        failure = _Failure(owes=self.exchange.processes is not None)
        if self.stage == 3:
            reduced = await self._layered_gradients(failure, x, y, offset)
        else:
            reduced = await self._whole_gradients(failure, x, y, offset)
        loss_sum, normaliser, squared = await self._totals(reduced, failure.error)
        check_loss(loss_sum)
        check_normaliser(normaliser)
        grad_norm = math.sqrt(squared) / normaliser
        check_gradient(grad_norm)
        comm = int((time.perf_counter_ns() - t0) // 1000)
        coefficient = clip_coefficient(grad_norm, self.config.gradient_clip)
        await self.update.apply(reduced.reduced_for, 1.0 / normaliser, coefficient)
        micros = int((time.perf_counter_ns() - t0) // 1000)
        loss = loss_sum / normaliser
        return StepStats(float(loss), float(grad_norm), micros, samples, True, comm)

    async def _totals(
        self, reduced: _Reduced, error: Exception | None
    ) -> tuple[float, float, float]:
        """The loss sum, normaliser and squared norm over the processes; one
        sum also says which processes failed phase 1 (a flag each).

        Raises:
            Exception: `error`, this process's own failure.
            OtherProcessFailed: another process failed (its rank named).
        """
        layout = self.exchange.layout
        flags = [0.0] * layout.processes
        if error is not None:
            flags[layout.process_rank] = 1.0
        totals = [reduced.loss_sum, reduced.normaliser, reduced.squared, *flags]
        summed = await self.exchange.sum_scalars(totals)
        if error is not None:
            if self.exchange.processes is not None:
                error.add_note(
                    f"on process rank {layout.process_rank}: every process ended this step "
                    "(nothing applied on any)"
                )
            raise error
        failed = [rank for rank, flag in enumerate(summed[3:]) if flag]
        if failed:
            raise OtherProcessFailed(
                f"a replica of other process(es) (rank {', '.join(map(str, failed))}) failed "
                "in this step's forward, backward or gradient reduction: nothing was "
                "applied on any process"
            )
        return summed[0], summed[1], summed[2]

    async def _whole_gradients(
        self, failure: _Failure, x: np.ndarray, y: np.ndarray, offset: int
    ) -> _Reduced:
        """Stages 1 and 2: every replica's gradient at once, one reduce-scatter."""
        msgs = []
        for (xs, ys), (lo, _) in zip(
            self.shards(x, y), split_bounds(len(x), len(self.refs)), strict=True
        ):
            msgs.append(ComputeShardGradients(xs, ys, offset + lo))
        results: list[ShardGradients] | None = await failure.ask(self._ask, msgs)
        if results is None:
            await self._reduce(0, self._zeros(0))
            return _Reduced(0.0, 0.0, 0.0, [None] * len(self.refs))
        handed = [r.handed for r in results]
        assert all(h is not None for h in handed)
        squared = await self._reduce(0, handed)  # type: ignore[arg-type]
        return _Reduced(
            sum(r.loss_sum for r in results),
            sum(r.normaliser for r in results),
            squared,
            _returned(handed),  # type: ignore[arg-type]
        )

    def _zeros(self, unit: int) -> list[Handed]:
        """What a process whose step failed contributes to a collective of `unit`."""
        lo, hi = self.exchange.layout.units[unit]
        return [Handed(np.zeros(hi - lo, dtype=self.dtype), False)]

    async def _reduce(self, unit: int, handed: list[Handed]) -> float:
        """Reduce-scatter one unit; the squared norm of the local replicas' parts."""
        buffers = [h.buffer for h in handed]
        if buffers[0].size == 0:  # a layer without parameters
            return 0.0
        await self.exchange.reduce_scatter(buffers)
        return float(await self.host.run(self._owned_squares, unit, buffers))

    def _owned_squares(self, unit: int, buffers: list[np.ndarray]) -> float:
        total = 0.0
        with np.errstate(over="ignore", invalid="ignore"):  # an inf total is refused later
            for k, buffer in enumerate(buffers):
                lo, hi = self.exchange.layout.unit_bounds(buffer.size, k)
                part = buffer[lo:hi].astype(np.float64)
                total += float(np.dot(part, part))
        return total

    async def _gather_layer(self, failure: _Failure, layer: int) -> list[np.ndarray | None]:
        """Stage 3: every replica's buffer of layer `layer`, all-gathered."""
        asked = [ShardLayerParams(layer)] * len(self.refs)
        handed: list[Handed] = await failure.ask(self._ask, asked) or self._zeros(layer)
        if handed[0].buffer.size:
            await self.exchange.all_gather([h.buffer for h in handed])
        return _returned(handed) if failure.error is None else [None] * len(self.refs)

    async def _forward(
        self, failure: _Failure, x: np.ndarray, y: np.ndarray, train: bool, offset: int = 0
    ) -> list[Any] | None:
        """Stage 3: the layers forward, one gathered at a time; the last
        layer's results (None: `failure` happened)."""
        shards = self.shards(x, y)
        starts = [offset + lo for lo, _ in split_bounds(len(x), len(self.refs))]
        n_layers = len(self.exchange.layout.units)
        results: list[Any] | None = []
        for layer in range(n_layers):
            gathered = await self._gather_layer(failure, layer)
            msgs = []
            for k, (xs, ys) in enumerate(shards):
                first, last = layer == 0, layer == n_layers - 1
                msgs.append(
                    ForwardLayer(
                        layer,
                        gathered[k],
                        xs if first else None,
                        ys if last else None,
                        train,
                        starts[k],
                    )
                )
            results = await failure.ask(self._ask, msgs)
        return results

    async def _layered_gradients(
        self, failure: _Failure, x: np.ndarray, y: np.ndarray, offset: int
    ) -> _Reduced:
        """Stage 3: forward, then backward layer by layer, each layer's
        gradient reduce-scattered as soon as it is done."""
        results: list[LayerForwardResult] | None = await self._forward(failure, x, y, True, offset)
        squared = 0.0
        reduced_above: list[np.ndarray | None] = [None] * len(self.refs)
        for layer in range(len(self.exchange.layout.units) - 1, -1, -1):
            gathered = await self._gather_layer(failure, layer)
            msgs = [
                BackwardLayer(layer, g, r) for g, r in zip(gathered, reduced_above, strict=True)
            ]
            handed = await failure.ask(self._ask, msgs)
            squared += await self._reduce(layer, handed or self._zeros(layer))
            reduced_above = _returned(handed) if handed else [None] * len(self.refs)
        if results is None or failure.error is not None:
            return _Reduced(0.0, 0.0, 0.0, [None] * len(self.refs))
        return _Reduced(
            sum(r.loss_sum for r in results),
            sum(r.normaliser for r in results),
            squared,
            reduced_above,
        )

    async def evaluate(self, x: np.ndarray, y: np.ndarray) -> tuple[float, float, int]:
        """Stage 3's evaluation: the layers forward, one gathered at a time.
        In a job, a replica failing on one process fails the evaluation on
        every process, after the forward's collectives (module docstring).

        Returns:
            The loss sum, normaliser and correct rows over the local replicas.

        Raises:
            Exception: the first failing replica's own error.
            OtherProcessFailed: only another process's replica failed.
            Exception: the collective's own error.
        """
        processes = self.exchange.processes
        failure = _Failure(owes=processes is not None)
        results = await self._forward(failure, x, y, train=False)
        if failure.error is not None:
            failure.error.add_note(
                f"on process rank {self.exchange.layout.process_rank}: every process "
                "ended this evaluation"
            )
        await agree_on_failure(processes, failure.error, "evaluate", others=_others_failed)
        assert results is not None  # a failure raised
        loss_sum = sum(r.loss_sum for r in results)
        return loss_sum, sum(r.normaliser for r in results), sum(r.correct for r in results)


def _others_failed(who: str, what: str) -> Exception:
    """The error of a process whose replicas did not fail, where others' (`who`) did."""
    return OtherProcessFailed(f"a replica of {who} failed to {what}: every process ended it")


def _returned(handed: list[Handed]) -> list[np.ndarray | None]:
    """What each replica must be sent back: None where its buffer was its own memory."""
    return [None if h.shared else h.buffer for h in handed]
