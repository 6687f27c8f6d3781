"""`TrainerHandle`: the one face every strategy's trainer shows the epoch loop.

`ActorTrainerHandle` wraps a trainer actor (single, data, tensor, pipeline,
parameter server: they all answer `Step`, `Evaluate`, `GetWeights`,
`SaveCheckpoint`, `LoadCheckpoint`); `DistributedTrainerHandle` wraps this
process's part of an MPI data-parallel job.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import numpy as np

from atomr.actor import ActorRef
from atomr.train import (
    EvalResult,
    Evaluate,
    GetWeights,
    LoadCheckpoint,
    SaveCheckpoint,
    Step,
    StepStats,
)

__all__ = [
    "ASK_TIMEOUT",
    "ActorTrainerHandle",
    "DistributedTrainerHandle",
    "TrainerHandle",
]

# Generous: one step of a large synthetic benchmark may take a while.
ASK_TIMEOUT = 600.0


class TrainerHandle(ABC):
    """A running trainer as the epoch loop sees it.

    Attributes:
        strategy: the `--strategy` name.
        is_root: True where this process writes files (always, except on
            the ranks > 0 of a distributed job).
        stops_between_steps: True when a stop request may end the run after
            any step; False when the processes of a job must first agree
            (`agree_to_stop`, at the end of an epoch).
    """

    is_root: bool = True
    stops_between_steps: bool = True

    def __init__(self, strategy: str) -> None:
        self.strategy = strategy

    async def agree_to_stop(self, requested: bool) -> bool:
        """Whether the run stops now, given this process's request (a job's
        processes all stop when any of them was asked to)."""
        return requested

    def abort_job(self, error: BaseException) -> None:
        """Called when training failed: a distributed job aborts every rank
        (so none waits for a peer that is gone); otherwise nothing."""
        del error  # a single process has nobody to tell

    @abstractmethod
    async def step(self, features: np.ndarray, labels: np.ndarray) -> StepStats:
        """One training step on a batch; raises what the trainer raised."""

    @abstractmethod
    async def evaluate(self, features: np.ndarray, labels: np.ndarray) -> EvalResult:
        """Loss and accuracy on a batch, weights untouched."""

    @abstractmethod
    async def weights(self) -> np.ndarray:
        """The full flat weight vector (`Mlp.params` layout)."""

    @abstractmethod
    async def _save(self, path: str) -> None: ...

    @abstractmethod
    async def load(self, path: Path) -> None:
        """Restore weights, optimizer state and step count from a checkpoint.

        Raises:
            CheckpointError: unreadable, or made for another model.
        """

    async def save(self, path: Path) -> None:
        """Write a checkpoint to `path`, creating its parent folders.

        Raises:
            CheckpointError, OSError: the file could not be written.
        """
        path.parent.mkdir(parents=True, exist_ok=True)
        await self._save(str(path))


class ActorTrainerHandle(TrainerHandle):
    """A trainer actor answering the common trainer messages.

    Args:
        strategy: the `--strategy` name.
        ref: the trainer actor.
    """

    def __init__(self, strategy: str, ref: ActorRef) -> None:
        super().__init__(strategy)
        self.ref = ref

    async def step(self, features: np.ndarray, labels: np.ndarray) -> StepStats:
        """Ask the trainer for one `Step`."""
        stats: StepStats = await self.ref.ask(Step(features, labels), timeout=ASK_TIMEOUT)
        return stats

    async def evaluate(self, features: np.ndarray, labels: np.ndarray) -> EvalResult:
        """Ask the trainer to `Evaluate`."""
        result: EvalResult = await self.ref.ask(Evaluate(features, labels), timeout=ASK_TIMEOUT)
        return result

    async def weights(self) -> np.ndarray:
        """Ask the trainer for its weights (`GetWeights`)."""
        weights: np.ndarray = await self.ref.ask(GetWeights(), timeout=ASK_TIMEOUT)
        return weights

    async def _save(self, path: str) -> None:
        await self.ref.ask(SaveCheckpoint(path), timeout=ASK_TIMEOUT)

    async def load(self, path: Path) -> None:
        """Ask the trainer to `LoadCheckpoint`."""
        await self.ref.ask(LoadCheckpoint(str(path)), timeout=ASK_TIMEOUT)


class DistributedTrainerHandle(TrainerHandle):
    """This process's part of an MPI data-parallel job
    (`atomr.train.data_parallel.distributed.DistributedDataParallel`).

    Every rank sends the same global batches; each trains on its shard.
    Checkpoints are written by rank 0 only; every rank loads them.

    Args:
        ddp: the `DistributedDataParallel` handle.
    """

    stops_between_steps = False

    def __init__(self, ddp: Any) -> None:
        super().__init__("data")
        self.ddp = ddp
        self.is_root = bool(ddp.config.is_root)

    async def step(self, features: np.ndarray, labels: np.ndarray) -> StepStats:
        """One step on the global batch (this rank trains on its shard); the
        stats count the global batch's samples."""
        stats: StepStats = await self.ddp.step(features, labels)
        return StepStats(
            stats.loss,
            stats.grad_norm,
            stats.step_micros,
            int(features.shape[0]),
            applied=stats.applied,
        )

    async def evaluate(self, features: np.ndarray, labels: np.ndarray) -> EvalResult:
        """Evaluate on this rank (every rank holds the same weights)."""
        result: EvalResult = await self.ddp.trainer.ask(
            Evaluate(features, labels), timeout=ASK_TIMEOUT
        )
        return result

    async def weights(self) -> np.ndarray:
        """This rank's weights (identical on every rank)."""
        weights: np.ndarray = await self.ddp.weights()
        return weights

    async def _save(self, path: str) -> None:
        await self.ddp.save_checkpoint(path)

    async def load(self, path: Path) -> None:
        """Every rank loads the checkpoint."""
        await self.ddp.load_checkpoint(str(path))

    def abort_job(self, error: BaseException) -> None:
        """After a collective failure (a rank died or timed out), abort the
        whole MPI job with exit code 2 and the error as the message."""
        from atomr.train.comm.mpi.collective import CollectiveError

        abort = getattr(self.ddp.collective, "abort", None)
        if isinstance(error, CollectiveError) and abort is not None:
            abort(2, f"{type(error).__name__}: {error}")

    async def agree_to_stop(self, requested: bool) -> bool:
        """All-reduce the stop requests: every rank stops if any was asked to."""
        if self.ddp.collective is None:
            return requested
        total = await self.ddp.collective.all_reduce([np.array([1.0 if requested else 0.0])])
        return bool(np.asarray(total).reshape(-1)[0] > 0)
