"""`ManualVerbs`: the data-parallel trainer's verbs for a hand-written loop.

flodl's `Ddp` lets a user who writes their own loop (GANs, RL, progressive
training) call each part of a step: broadcast the parameters from rank 0,
all-reduce the gradients (plain, or weighted by per-replica batch counts),
step, and ask the world size and devices. Here they are messages of the
`DataParallelTrainer` (`SyncParams`, `ComputeReplicaGradients`,
`AllReduceGradients`, `WeightedAllReduceGradients`, `ApplyGradients`,
`GetWorldSize`, `GetDevices`). The reductions go through the host (the
gradient buffers are gathered, combined, written back), and across the
processes of a job through the process collective; `ApplyGradients` is the
trainer's own two-phase apply, so a failure on any replica changes no
weights anywhere.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from atomr.actor import Failure
from atomr.train.comm._fanout import ask_all
from atomr.train.comm.purpose import purpose
from atomr.train.core._step_checks import check_step_limit
from atomr.train.core.config import TrainerConfig
from atomr.train.data_parallel._reduction import Reduced
from atomr.train.data_parallel._replicas import ReplicaGroup
from atomr.train.data_parallel._step import StepRunner
from atomr.train.data_parallel.messages import (
    AllReduceGradients,
    ApplyGradients,
    ComputeGradients,
    ComputeReplicaGradients,
    GetGradients,
    GetWorldSize,
    GradientResult,
    SetGradients,
    SyncParams,
    WeightedAllReduceGradients,
)
from atomr.train.data_parallel.options import DataParallelOptions

__all__ = ["MANUAL_VERBS", "ManualVerbs", "check_batch_counts"]

MANUAL_VERBS = (
    SyncParams,
    ComputeReplicaGradients,
    AllReduceGradients,
    WeightedAllReduceGradients,
    ApplyGradients,
    GetWorldSize,
)
"""The messages of a hand-written loop, which the trainer passes to `ManualVerbs`
(`GetDevices` too is one, answered by the trainer before it syncs the replicas)."""


def check_batch_counts(counts: Any, replicas: int) -> np.ndarray:
    """The per-replica batch counts of a weighted all-reduce, as float64.

    Raises:
        TypeError: not a sequence of numbers.
        ValueError: empty, not one per replica, negative, not finite, or all 0.
    """
    if isinstance(counts, str | bytes) or not isinstance(counts, Sequence | np.ndarray):
        raise TypeError(f"batch_counts must be a sequence of numbers, got {counts!r}")
    if len(counts) != replicas:
        raise ValueError(
            f"batch_counts needs one count per replica ({replicas}), got {len(counts)}"
        )
    try:
        values = np.asarray(counts, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"batch_counts must be numbers, got {counts!r}") from None
    if not np.isfinite(values).all() or (values < 0).any() or not values.sum() > 0:
        raise ValueError(f"batch_counts must be finite, >= 0 and not all 0, got {list(counts)}")
    return values


class ManualVerbs:
    """The verbs, over one trainer's replicas and (in a job) process collective.

    The gradients in the replicas' buffers are applied at most once: from a
    `ComputeReplicaGradients` to the `ApplyGradients` that uses them. The
    buffers also hold what a `Step` computed (and applied); `forget` says so.
    While a `Step` accumulation window is open they hold its partial sums,
    and every verb that reads or writes them is refused.
    """

    def __init__(
        self,
        config: TrainerConfig,
        options: DataParallelOptions,
        replicas: ReplicaGroup,
        runner: StepRunner,
    ) -> None:
        self.config, self.options, self.replicas, self.runner = config, options, replicas, runner
        self._computed = False  # the buffers hold gradients not applied yet

    async def answer(self, message: Any) -> Any:
        """Answer one of `MANUAL_VERBS`.

        Raises:
            As the verb's method (`compute`, `all_reduce`, `apply`), or the
            replicas' broadcast (`SyncParams`).
        """
        if isinstance(message, SyncParams):
            return await self.replicas.broadcast_first(self.options.process_collective)
        if isinstance(message, ComputeReplicaGradients):
            return await self.compute(list(message.batches))
        if isinstance(message, AllReduceGradients):
            return await self.all_reduce()
        if isinstance(message, WeightedAllReduceGradients):
            return await self.all_reduce(message.batch_counts)
        if isinstance(message, ApplyGradients):
            return await self.apply()
        return len(self.replicas.refs) * self.options.process_count  # GetWorldSize

    def forget(self) -> None:
        """The buffers were overwritten (a `Step`) or replaced (new replicas):
        nothing is left for `ApplyGradients` until the next `compute`."""
        self._computed = False

    def _check_no_window(self, verb: str) -> None:
        """Refuse a verb while a `Step` accumulation window is open: the
        buffers hold its partial sums, which the window's last `Step` applies."""
        micro = self.runner.window.micro
        if micro > 0:
            raise RuntimeError(
                f"{verb}: an accumulation window is open ({micro} of "
                f"{self.config.accumulation_steps} micro-batches in the replicas' gradient "
                "buffers): finish it with Step first (LoadCheckpoint or SetReplicas drops it)"
            )

    def _require_gradients(self, verb: str) -> None:
        self._check_no_window(verb)
        if not self._computed:
            raise RuntimeError(
                f"{verb}: no gradients to use (none computed since the last "
                "ApplyGradients or Step): send ComputeReplicaGradients first"
            )

    async def compute(self, batches: Sequence[tuple[Any, Any]]) -> list[float]:
        """Replica `i`'s buffer: the mean gradient of `batches[i]`; their mean losses.

        Raises:
            RuntimeError: a `Step` accumulation window is open (nothing changed).
            ValueError, InvalidBatchError: not one valid batch per replica.
        """
        self._check_no_window("ComputeReplicaGradients")
        if len(batches) != len(self.replicas.refs):
            raise ValueError(
                f"ComputeReplicaGradients needs one batch per replica "
                f"({len(self.replicas.refs)}), got {len(batches)}"
            )
        self._computed = False
        spec = self.replicas.spec()
        messages = []
        for x, y in batches:
            x, y = spec.validate(x, y, self.config.loss)
            messages.append(ComputeGradients(x, y, return_gradients=True))
        results: list[GradientResult] = await self.replicas.gather_each(messages)
        means = [(np.asarray(r.gradients) / r.normaliser).astype(spec.dtype) for r in results]
        await ask_all(self.replicas.refs, [SetGradients(m) for m in means], self.replicas.timeout)
        self._computed = True
        return [r.loss_sum / r.normaliser for r in results]

    async def all_reduce(self, counts: Any = None) -> float:
        """Every buffer := the (count-weighted) mean of all (summed in float64,
        written in the model's dtype); the result's norm.

        Raises:
            RuntimeError: no gradients computed since the last apply, or a `Step`
                accumulation window is open (nothing changed).
            TypeError, ValueError: bad `counts` (nothing changed).
        """
        self._require_gradients("AllReduceGradients")
        weights = None if counts is None else check_batch_counts(counts, len(self.replicas.refs))
        self._computed = False  # until every buffer holds the mean
        grads = await self.replicas.gather(GetGradients())
        total = np.zeros(np.asarray(grads[0]).shape, dtype=np.float64)
        for k, g in enumerate(grads):
            total += np.asarray(g, dtype=np.float64) * (1.0 if weights is None else weights[k])
        divisor = np.array([float(len(grads)) if weights is None else weights.sum()])
        processes = self.options.process_collective
        if processes is not None:
            with purpose("average gradients"):
                await processes.all_reduce([total])
                await processes.all_reduce([divisor])
        mean = (total / divisor[0]).astype(self.replicas.spec().dtype)  # the model's dtype
        await ask_all(
            self.replicas.refs, SetGradients(mean), self.replicas.timeout, per_worker=False
        )
        self._computed = True
        return float(math.sqrt(float(np.dot(mean, mean))))

    async def apply(self) -> float:
        """Every replica steps by its own buffer, all or none; the norm before clipping.

        Raises:
            RuntimeError: no gradients computed since the last apply or `Step`
                (nothing applied: they were applied already), or a `Step`
                accumulation window is open (nothing applied).
            StepLimitError: the trainer is at `max_steps` (nothing applied).
            Exception: what a replica answered (nothing applied anywhere).
        """
        self._require_gradients("ApplyGradients")
        check_step_limit(self.runner.steps, self.config.max_steps)
        self._computed = False  # applied, or (a replica failed) repaired: compute again
        reduced = Reduced(gradients=None, grad_norm=None, loss_sum=0.0, normaliser=1.0)
        stats = await self.runner.apply(reduced, 0, time.perf_counter_ns(), 0)
        if isinstance(stats, Failure):
            raise stats.exception  # the replicas were repaired; nothing applied
        return float(stats.grad_norm)
