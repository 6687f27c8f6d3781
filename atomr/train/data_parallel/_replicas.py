"""`ReplicaGroup`: a data-parallel trainer's replicas in rank order, and how
they are kept identical: the initial broadcast of replica 0's state,
re-syncing the replicas that crashed from a healthy one, going on without
the ones that stopped, and the periodic divergence check."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from atomr.accel.serial_worker import SerialWorker
from atomr.actor import ActorRef, Failure, actor_failed
from atomr.train._recovery import resync
from atomr.train.comm._fanout import ask_all, ask_all_settled, failed_indices
from atomr.train.comm.collective import Collective
from atomr.train.comm.purpose import purpose
from atomr.train.core.device_guard import REQUEST_ERRORS
from atomr.train.core.messages import GetWeights
from atomr.train.core.models import batch_spec
from atomr.train.core.validation import BatchSpec
from atomr.train.data_parallel.messages import GetState, ReplicaState, SetState

__all__ = ["ReplicaDivergenceError", "ReplicaGroup", "crashed"]

logger = logging.getLogger(__name__)


def crashed(error: object) -> bool:
    """Whether a replica's failed request may have cost it its state: the
    error escaped its `receive` (`actor_failed`: its supervisor restarted,
    resumed or stopped it), whatever its type, or it is not a
    `REQUEST_ERRORS` one (a stopped replica, a replica's own answer of an
    unexpected error). A `REQUEST_ERRORS` exception the replica answered
    itself (`Failure`) left it intact, and so does an ask timeout (an
    `OSError`, so one of them): the late replica is intact, and what the
    trainer sends it next (a rollback, a learning rate) is queued behind
    the late request, so it arrives in order. Read it as soon as the ask
    settled (see `actor_failed`)."""
    if not isinstance(error, BaseException):
        return False
    return actor_failed(error) or not isinstance(error, REQUEST_ERRORS)


class ReplicaDivergenceError(RuntimeError):
    """The periodic check (`DataParallelOptions.check_every`) found replicas
    whose weights differ."""


class ReplicaGroup:
    """The replicas of one trainer and their shared facts.

    Args:
        timeout: seconds to wait for any one replica's reply (`math.inf`:
            forever).

    Attributes:
        refs: the replicas, in rank order.
        lost: why the replicas' state is lost (none healthy is left to
            re-sync from), or None; then only a checkpoint load helps.
        model: the model config (`Mlp.config()`) of replica 0, once synced.
        n_params: its parameter count, once synced.
        generation: counts the changes of `refs`.
    """

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.refs: list[ActorRef] = []
        self.lost: BaseException | None = None
        self.model: dict[str, Any] = {}
        self.n_params = 0
        self._spec: BatchSpec | None = None
        self.generation = 0
        self._synced = False

    def replace(self, refs: Sequence[ActorRef]) -> None:
        """Take these replicas; they are synced before the next request."""
        self.refs = list(refs)
        self.generation += 1
        self._synced = False

    async def average_weights(self, host: SerialWorker) -> None:
        """Every replica's weights become the mean of all of them (each keeps
        its own optimizer state): local SGD's averaging round. The mean is
        computed on `host`, not on the event loop.

        Raises:
            Exception: the first failing replica's own exception.
        """
        states: list[ReplicaState] = await self.gather(GetState())
        weights = await host.run(_mean_weights, [s.weights for s in states])
        updates = [SetState(ReplicaState(s.model, weights, s.optimizer, s.steps)) for s in states]
        await ask_all(self.refs, updates, self.timeout)

    async def ask_each(self, messages: Sequence[Any]) -> list[Any]:
        """One message per replica; every outcome, exceptions included."""
        return await ask_all_settled(self.refs, messages, self.timeout)

    async def ask_every(self, message: Any, refs: Sequence[ActorRef] | None = None) -> list[Any]:
        """`message` to every replica (or to `refs`); every outcome."""
        targets = self.refs if refs is None else refs
        return await ask_all_settled(targets, message, self.timeout, per_worker=False)

    async def gather(self, message: Any) -> list[Any]:
        """`message` to every replica; the replies.

        Raises:
            Exception: the first failing replica's own exception.
        """
        return await ask_all(self.refs, message, self.timeout, per_worker=False)

    async def gather_each(self, messages: Sequence[Any]) -> list[Any]:
        """One message per replica; the replies.

        Raises:
            Exception: the first failing replica's own exception.
        """
        return await ask_all(self.refs, messages, self.timeout)

    async def sync(self, processes: Collective | None) -> None:
        """Once after `replace`: give every replica replica 0's state (in a
        multi-process job, process 0's replica 0's weights, broadcast through
        `processes`) and learn the model config.

        Raises:
            Exception: a replica's or the collective's failure.
        """
        if self._synced:
            return
        await self.broadcast_first(processes)
        self._synced = True

    async def broadcast_first(self, processes: Collective | None) -> None:
        """Give every replica replica 0's state; in a job, process 0's replica
        0's weights through `processes`, with this process's replica 0's
        optimizer state (its learning rate included) and step count, which
        every process's replicas share (they apply the same steps). Learn the
        model config.

        Raises:
            Exception: a replica's or the collective's failure.
        """
        state: ReplicaState = await self.refs[0].ask(GetState(), timeout=self.timeout)
        first = 1  # replica 0 has its state
        if processes is not None:
            weights = np.ascontiguousarray(state.weights)
            with purpose("sync weights"):
                await processes.broadcast([weights], 0)
            state = ReplicaState(state.model, weights, state.optimizer, state.steps)
            first = 0
        if self.refs[first:]:
            await ask_all(
                self.refs[first:],
                SetState(state),
                self.timeout,
                per_worker=False,
                first_index=first,
            )
        self.model = dict(state.model)
        self._spec = None
        self.n_params = int(np.asarray(state.weights).size)

    def spec(self) -> BatchSpec:
        """What the replicas' model takes and gives (from its config, once)."""
        if self._spec is None:
            self._spec = batch_spec(self.model)
        return self._spec

    async def repair(
        self, results: list[Any], outcome: str = "the step was not applied"
    ) -> Failure:
        """After a failed phase: re-sync the replicas that crashed.

        Args:
            results: the phase's settled replies (`ask_each`).
            outcome: what the failure left undone, for the note.

        Returns:
            A `Failure` with the first failing replica's exception,
            `worker_index` set and a note naming the replica.
        """
        failed = failed_indices(results)
        await self.resync_crashed(results)
        error = results[failed[0]]
        error.worker_index = failed[0]
        error.add_note(f"raised by replica {failed[0]}; {outcome}")
        return Failure(error)

    async def resync_crashed(self, results: list[Any]) -> None:
        """After a failed request: re-sync the replicas that crashed in it
        (`resync`); `results` are its settled replies (`ask_each`)."""
        failed = failed_indices(results)
        await self.resync([i for i in failed if crashed(results[i])], failed)

    async def resync(self, crashed: list[int], failed: list[int]) -> None:
        """Copy a healthy replica's state (one not in `failed`) into each
        crashed (restarted) one; drop the ones that stopped; set `lost` when
        none is healthy or a re-sync failed."""
        if not crashed:
            return
        healthy = [i for i in range(len(self.refs)) if i not in failed]
        if not healthy:
            self.lost = RuntimeError(f"replicas {crashed} failed and none is healthy")
            logger.error("DataParallelTrainer: no healthy replica left to re-sync from")
            return
        state = await self.refs[healthy[0]].ask(GetState(), timeout=self.timeout)
        outcome = await resync(self.refs, crashed, lambda _: (SetState(state),), self.timeout)
        if outcome.gone:
            self.drop(outcome.gone)
        if outcome.bad:
            self.lost = RuntimeError(f"replicas {outcome.bad} could not be re-synced")

    def drop(self, gone: list[int]) -> None:
        """Go on without the replicas that stopped (the others stay in sync)."""
        logger.warning("DataParallelTrainer: replicas %s stopped; going on without them", gone)
        self.refs = [r for i, r in enumerate(self.refs) if i not in gone]
        self.generation += 1

    async def check_identical(self, steps: int) -> None:
        """Raises: ReplicaDivergenceError: a replica's weights differ from replica 0's."""
        weights = await self.gather(GetWeights())
        differ = [i for i, w in enumerate(weights) if not np.array_equal(w, weights[0])]
        if differ:
            logger.error("DataParallelTrainer: replicas %s differ from replica 0", differ)
            worst = max(float(np.max(np.abs(weights[i] - weights[0]))) for i in differ)
            raise ReplicaDivergenceError(
                f"after step {steps}, replicas {differ} hold weights different from "
                f"replica 0's (max abs difference {worst:.3g})"
            )


def _mean_weights(weights: list[np.ndarray]) -> np.ndarray:
    """The mean of the replicas' weight vectors (in float64, then their dtype)."""
    mean = np.mean([np.asarray(w, dtype=np.float64) for w in weights], axis=0)
    return mean.astype(np.asarray(weights[0]).dtype)
