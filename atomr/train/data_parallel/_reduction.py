"""Between the two phases of a data-parallel step: the replicas' gradient
sums become the one final gradient every replica applies.

The trainer's collective says where the buffers live
(`Collective.members_hold_buffers`), and so which way the sum goes:

- host arrays (`HostCollective`, the default): the replicas hand their
  gradient buffers over with their `GradientResult`; the collective sums
  them into one host array;
- the members' own buffers (`RingCollective`): the replicas reduce among
  themselves and each keeps the sum; nothing reaches the trainer, and each
  replica scales, measures and clips its own copy when it applies.

In a multi-process job the local sum, loss sum and normaliser are then
summed across the processes (`DataParallelOptions.process_collective`,
host arrays; a ring first hands over replica 0's sum). Last, on the host
thread, the sum is divided by the total normaliser, its norm measured and
the result clipped (one pass), unless the replicas do it themselves.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, cast

import numpy as np

from atomr.accel.serial_worker import SerialWorker
from atomr.actor import ActorRef, Failure
from atomr.train._recovery import ResumedCrashWatch
from atomr.train.comm.collective import Collective
from atomr.train.comm.purpose import purpose
from atomr.train.core._cpu import cpu_backend
from atomr.train.core._step_checks import check_gradient, check_loss, check_normaliser
from atomr.train.core.clip import clip_grad_norm
from atomr.train.core.device_guard import REQUEST_ERRORS
from atomr.train.data_parallel._replicas import ReplicaGroup
from atomr.train.data_parallel.messages import GradientResult

__all__ = ["GradientReduction", "Reduced"]


class _MembersAllReduce(Protocol):
    """`all_reduce` of a collective whose members hold the buffers (the
    keywords `Collective.members_hold_buffers` documents)."""

    async def all_reduce(
        self,
        buffers: Sequence[ActorRef],
        *,
        result_from: int | None = None,
        interrupt: asyncio.Future[BaseException] | None = None,
    ) -> np.ndarray | None: ...


@dataclass(frozen=True, eq=False)
class Reduced:
    """The final gradient of a step.

    Attributes:
        gradients: the final gradient (host array), or None when every
            replica turns its own buffer into it (`scale`, clip).
        grad_norm: its norm before clipping, or None with `gradients` None
            (the replicas report it).
        loss_sum: the loss sum over every replica (and process).
        normaliser: the total normaliser.
    """

    gradients: np.ndarray | None
    grad_norm: float | None
    loss_sum: float
    normaliser: float

    @property
    def scale(self) -> float:
        """`1 / normaliser`: turns the gradient sum into the mean."""
        return 1.0 / self.normaliser


def check_totals(loss_sum: float, normaliser: float) -> Failure | None:
    """A `Failure` if the step's total loss or normaliser makes it unusable."""
    try:
        check_loss(loss_sum)
        check_normaliser(normaliser)
    except REQUEST_ERRORS as exc:
        return Failure(exc)
    return None


def _finalize(grads: np.ndarray, scale: float, clip: float | None) -> float:
    """On the host thread: `grads *= scale` and its norm (one fused pass), then
    clip to `clip` if set and the norm is finite. Returns the norm."""
    flat = grads.reshape(-1)  # the collective's own output: the unchecked kernel
    norm = math.sqrt(cpu_backend().sum_scale_norm_unchecked(flat, (flat,), flat.dtype.type(scale)))
    if clip is not None and math.isfinite(norm):
        clip_grad_norm(cpu_backend(), grads, clip, norm)
    return norm


class GradientReduction:
    """Turns a step's `GradientResult`s into its `Reduced` gradient.

    Args:
        collective: sums the replicas' gradients.
        processes: sums across the processes of a job, or None.
        replicas: the trainer's replicas (a failed ring re-syncs them).
        watch: the trainer's record of replicas resumed during the ring.
        host: the thread for the host-side math.
        clip: `TrainerConfig.gradient_clip`.
    """

    def __init__(
        self,
        collective: Collective,
        processes: Collective | None,
        replicas: ReplicaGroup,
        watch: ResumedCrashWatch,
        host: SerialWorker,
        clip: float | None,
    ) -> None:
        self.collective = collective
        self.processes = processes
        self.replicas = replicas
        self.watch = watch
        self.host = host
        self.clip = clip

    @property
    def wants_gradients(self) -> bool:
        """True when the replicas must hand their gradient buffers over."""
        return not self.collective.members_hold_buffers

    async def reduce(
        self, grads: list[GradientResult], loss_sum: float, normaliser: float
    ) -> Reduced | Failure:
        """Sum, (across processes,) divide, measure and clip.

        Args:
            grads: every replica's phase-1 result, in rank order.
            loss_sum, normaliser: this process's totals over the replicas
                (and the accumulation window).

        Returns:
            The `Reduced` gradient, or a `Failure` (nothing was applied):
            a non-finite loss or gradient, a zero normaliser, or a failed
            ring (its crashed members already re-synced).

        Raises:
            Exception: the collectives' own failures.
        """
        if self.collective.members_hold_buffers:
            summed = await self._on_members()
            if isinstance(summed, Failure):
                return summed
        else:
            buffers = []
            for g in grads:
                buffers.append(g.gradients)
            summed = await self.collective.all_reduce(buffers)
        if self.processes is not None:
            loss_sum, normaliser, summed = await self._across_processes(
                loss_sum, normaliser, summed
            )
        bad = check_totals(loss_sum, normaliser)
        if bad is not None:
            return bad
        if summed is None:
            return Reduced(None, None, loss_sum, normaliser)
        norm = await self.host.run(_finalize, summed, 1.0 / normaliser, self.clip)
        try:
            check_gradient(norm)
        except REQUEST_ERRORS as exc:
            return Failure(exc)
        return Reduced(summed, float(norm), loss_sum, normaliser)

    async def _on_members(self) -> np.ndarray | None | Failure:
        """The members reduce their own buffers; a host copy of replica 0's
        sum comes back when the processes still have to sum it."""
        members = cast(_MembersAllReduce, self.collective)
        # a replica resumed on a told message (a ring chunk) lost it: end at once
        interrupt = self.watch.begin()
        try:
            return await members.all_reduce(
                self.replicas.refs,
                result_from=None if self.processes is None else 0,
                interrupt=interrupt,
            )
        except Exception as exc:
            # re-sync every member that failed on its own (a re-sync of a
            # healthy one is harmless: it copies identical state); after an
            # interrupt the list is empty: the resumed replica kept its weights
            failed = list(getattr(exc, "failed_workers", [getattr(exc, "worker_index", 0)]))
            await self.replicas.resync(failed, failed)
            exc.add_note("the all-reduce among the replicas failed; the step was not applied")
            return Failure(exc)
        finally:
            self.watch.end()

    async def _across_processes(
        self, loss_sum: float, normaliser: float, summed: np.ndarray | None
    ) -> tuple[float, float, np.ndarray]:
        """Sum the totals and the gradient sum over every process."""
        assert self.processes is not None and summed is not None
        scalars = np.array([loss_sum, normaliser], dtype=np.float64)
        with purpose("step scalars"):
            scalars = await self.processes.all_reduce([scalars])
        with purpose("gradients"):
            summed = await self.processes.all_reduce([summed])
        return float(scalars[0]), float(scalars[1]), summed
