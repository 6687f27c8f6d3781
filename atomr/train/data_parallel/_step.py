"""`StepRunner`: the two phases of a data-parallel step, and the gradient
accumulation window.

1. Every replica computes the gradient of its shard's loss *sum*
   (`ComputeGradients`), touching no weights. Inside an accumulation window
   (`TrainerConfig.accumulation_steps` K > 1) the first K-1 steps stop here:
   the replicas add into their own buffers and nothing is exchanged. On the
   window's last step the sums are reduced (`GradientReduction`). If
   anything fails here, no weights changed anywhere.
2. Every replica applies the reduced gradient, keeping its old state
   (`ApplyReducedGradients`); if one fails, the others roll back (`Rollback`;
   so does one whose ask timed out, since it may still apply) and the
   crashed one is re-synced.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import numpy as np

from atomr.actor import AskTimeoutError, Failure
from atomr.train.comm._fanout import failed_indices
from atomr.train.core.accumulation import AccumulationWindow
from atomr.train.core.config import TrainerConfig
from atomr.train.core.partition import split_sizes
from atomr.train.core.stats import StepStats
from atomr.train.data_parallel._reduction import GradientReduction, Reduced
from atomr.train.data_parallel._replicas import ReplicaGroup
from atomr.train.data_parallel.messages import (
    ApplyReducedGradients,
    ComputeGradients,
    GradientResult,
    Rollback,
)
from atomr.train.data_parallel.options import DataParallelOptions
from atomr.train.data_parallel.speed_balancer import SpeedBalancer

__all__ = ["StepRunner"]


def _micros_since(t0: int) -> int:
    return int((time.perf_counter_ns() - t0) // 1000)


class StepRunner:
    """Runs steps over a trainer's replicas.

    Args:
        config: the trainer's config (accumulation, clipping).
        options: the trainer's options (balancing, divergence checks).
        replicas: the replicas.
        reduction: the reduction between the phases.

    Attributes:
        steps: optimizer steps applied.
        window: the open accumulation window.
    """

    def __init__(
        self,
        config: TrainerConfig,
        options: DataParallelOptions,
        replicas: ReplicaGroup,
        reduction: GradientReduction,
    ) -> None:
        self.config = config
        self.options = options
        self.replicas = replicas
        self.reduction = reduction
        self.steps = 0
        self.window = AccumulationWindow()
        self._tokens = itertools.count(1)
        self._balancer: SpeedBalancer | None = None
        self._generation = -1

    def balancer(self) -> SpeedBalancer:
        """The split of the batches, made afresh whenever the replicas change."""
        if self._balancer is None or self._generation != self.replicas.generation:
            o, n = self.options, max(1, len(self.replicas.refs))
            hint = o.speed_hint if o.speed_hint is not None and len(o.speed_hint) == n else None
            self._balancer = SpeedBalancer(
                n,
                enabled=o.balance,
                speed_hint=hint,  # none once a replica was dropped
                recalibrate_every=o.recalibrate_every,
                min_share=min(o.min_share, 1.0 / n),
            )
            self._generation = self.replicas.generation
        return self._balancer

    def shards(self, x: np.ndarray, y: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """One contiguous `(features, labels)` shard per replica."""
        rows, n = int(x.shape[0]), max(1, len(self.replicas.refs))
        sizes = self.balancer().split(rows) if rows > 0 else split_sizes(0, n)
        shards, lo = [], 0
        for size in sizes:
            shards.append((x[lo : lo + size], y[lo : lo + size]))
            lo += size
        return shards

    async def step(
        self, x: np.ndarray, y: np.ndarray, samples: int, offset: int = 0
    ) -> StepStats | Failure:
        """One `Step` on this process's rows `x`, `y`.

        Args:
            x, y: the validated rows (in a multi-process job: this process's
                shard of the global batch).
            samples: the rows of the whole batch, for `StepStats.samples`.
            offset: the index of `x`'s first row in the whole batch.

        Returns:
            The `StepStats`, or a `Failure` (nothing applied anywhere).
        """
        t0 = time.perf_counter_ns()
        last = self.window.micro + 1 >= self.config.accumulation_steps
        accumulate = self.window.micro > 0
        hand_over = last and self.reduction.wants_gradients
        msgs, lo = [], self.window.samples + offset  # the window is one batch
        for xs, ys in self.shards(x, y):
            msgs.append(ComputeGradients(xs, ys, accumulate, hand_over, lo, not last))
            lo += int(xs.shape[0])
        results = await self.replicas.ask_each(msgs)
        if failed_indices(results):
            self.window.reset()
            return await self.replicas.repair(results)
        grads: list[GradientResult] = results
        balancer = self.balancer()
        if balancer.enabled:  # it learns the replicas' speeds
            balancer.record([r.samples for r in grads], [r.micros for r in grads])
        loss_sum, normaliser = 0.0, 0.0
        for r in grads:
            loss_sum += r.loss_sum
            normaliser += r.normaliser
        if not last:
            self.window.add(loss_sum, normaliser, samples)
            loss = loss_sum / max(normaliser, 1e-300)
            return StepStats(float(loss), 0.0, _micros_since(t0), samples, applied=False)
        loss_sum, normaliser = self.window.close(loss_sum, normaliser)
        reduce_started = time.perf_counter_ns()
        reduced = await self.reduction.reduce(grads, loss_sum, normaliser)
        if isinstance(reduced, Failure):
            return reduced
        comm = _micros_since(reduce_started)
        return await self.apply(reduced, samples, t0, comm)

    def next_token(self) -> int:
        """A fresh token for one apply (`Rollback` names it)."""
        return next(self._tokens)

    async def apply_all(
        self, applies: ApplyReducedGradients | list[ApplyReducedGradients], token: int
    ) -> list[Any] | Failure:
        """Every replica applies (one message for all, or one each), or none
        keeps the step: a failure anywhere rolls the others back and repairs.

        Returns:
            The replies, or the `Failure` to answer with.
        """
        if isinstance(applies, list):
            results = await self.replicas.ask_each(applies)
        else:
            results = await self.replicas.ask_every(applies)
        if failed_indices(results):
            # a replica whose ask timed out may still apply: its Rollback waits behind it
            undo = [
                ref
                for ref, res in zip(self.replicas.refs, results, strict=True)
                if not isinstance(res, BaseException) or isinstance(res, AskTimeoutError)
            ]
            await self.replicas.ask_every(Rollback(token), undo)
            return await self.replicas.repair(results)
        return results

    async def apply(
        self, reduced: Reduced, samples: int, t0: int, comm_micros: int
    ) -> StepStats | Failure:
        """Phase 2: every replica applies, or none keeps the step."""
        token = self.next_token()
        if reduced.gradients is None:  # each replica finalises its own buffer
            clip = self.config.gradient_clip
            apply = ApplyReducedGradients(None, scale=reduced.scale, clip=clip, token=token)
        else:
            apply = ApplyReducedGradients(reduced.gradients, token=token)
        results = await self.apply_all(apply, token)
        if isinstance(results, Failure):
            return results
        grad_norm = reduced.grad_norm if reduced.grad_norm is not None else float(results[0])
        self.steps += 1
        check = self.options.check_every
        if check is not None and self.steps % check == 0:
            await self.replicas.check_identical(self.steps)
        loss = reduced.loss_sum / reduced.normaliser
        return StepStats(
            float(loss), float(grad_norm), _micros_since(t0), samples, True, comm_micros
        )
