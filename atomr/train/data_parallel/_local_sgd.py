"""`LocalSgd`: the data-parallel step under `ApplyPolicy.ASYNC`.

Each replica computes its shard's gradient and applies its mean with its own
optimizer (all or none, as a synchronous step applies); every
`average_every` steps, or at the first step that ends `average_seconds`
after the last round, the replicas' weights are averaged (the mean computed
on the trainer's host thread). Nothing is exchanged between two rounds.
"""

from __future__ import annotations

import time

import numpy as np

from atomr.accel.serial_worker import SerialWorker
from atomr.actor import Failure
from atomr.train._fanout import failed_indices
from atomr.train.core.stats import StepStats
from atomr.train.data_parallel._step import StepRunner
from atomr.train.data_parallel.messages import (
    ApplyReducedGradients,
    ComputeGradients,
    GradientResult,
)

__all__ = ["LocalSgd"]


class LocalSgd:
    """Local SGD steps over a `StepRunner`'s replicas.

    Args:
        runner: the trainer's step runner (its shards, apply and step count).
        every: steps between two averaging rounds.
        seconds: also a round once this long has passed since the last (None: never).
        host: the thread the mean is computed on.
    """

    def __init__(
        self, runner: StepRunner, every: int, seconds: float | None, host: SerialWorker
    ) -> None:
        self.runner = runner
        self.every = every
        self.seconds = seconds
        self.host = host
        self.last_round = time.monotonic()
        self.rounds = 0

    def _due(self) -> bool:
        """Whether this step ends with a round (by steps, or by time)."""
        if self.runner.steps % self.every == 0:
            return True
        return self.seconds is not None and time.monotonic() - self.last_round >= self.seconds

    async def step(self, x: np.ndarray, y: np.ndarray, samples: int) -> StepStats | Failure:
        """One local step of every replica on its shard, then maybe a round.

        Returns:
            The `StepStats` (loss over the whole batch; the replicas' mean
            gradient norm; `comm_micros`, the averaging round's time), or the
            `Failure` to answer with (nothing applied anywhere).
        """
        t0 = time.perf_counter_ns()
        runner, replicas = self.runner, self.runner.replicas
        shards = runner.shards(x, y)
        if any(len(ys) == 0 for _, ys in shards):
            return Failure(
                ValueError(
                    f"ApplyPolicy.ASYNC needs a sample for each of the {len(shards)} replicas, "
                    f"got a batch of {int(x.shape[0])}"
                )
            )
        results = await replicas.ask_each([ComputeGradients(xs, ys) for xs, ys in shards])
        if failed_indices(results):
            return await replicas.repair(results)
        grads: list[GradientResult] = results
        token = runner.next_token()
        clip = runner.config.gradient_clip
        applies = [
            ApplyReducedGradients(None, scale=1.0 / r.normaliser, clip=clip, token=token)
            for r in grads
        ]
        norms = await runner.apply_all(applies, token)
        if isinstance(norms, Failure):
            return norms
        runner.steps += 1
        started = time.perf_counter_ns()
        if self._due():
            await replicas.average_weights(self.host)
            self.last_round = time.monotonic()
            self.rounds += 1
        comm = (time.perf_counter_ns() - started) // 1000
        loss = sum(r.loss_sum for r in grads) / sum(r.normaliser for r in grads)
        norm = float(np.mean([float(n) for n in norms]))
        micros = (time.perf_counter_ns() - t0) // 1000
        return StepStats(float(loss), norm, int(micros), samples, True, int(comm))
