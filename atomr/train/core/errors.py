"""Exceptions raised by the training layer."""

from __future__ import annotations

__all__ = [
    "CheckpointError",
    "InvalidBatchError",
    "NonFiniteError",
    "OtherProcessFailed",
    "StepLimitError",
    "WorkerStateLost",
]


class InvalidBatchError(ValueError):
    """A batch was rejected before any math ran: wrong shape, dtype, label
    range, or non-finite values. The model's weights are untouched."""


class NonFiniteError(FloatingPointError):
    """A loss or gradient came out NaN or infinite; the step was not applied
    and the model's weights are untouched."""


class CheckpointError(Exception):
    """A checkpoint could not be written or read: corrupted, truncated, of an
    unknown format, or made for a model of another shape."""


class WorkerStateLost(RuntimeError):
    """A worker of a tensor-parallel, pipeline, sharded or parameter-server
    trainer lost its part of the model: its device context was poisoned
    (`ContextPoisoned`), so it was restarted from its `Props` with its
    initial weights and optimizer state. The trainer keeps no copy to
    restore it from: it answers every request with this error until a
    `LoadCheckpoint` succeeds, which gives every worker its part of the
    checkpoint again.

    Attributes:
        worker: the worker's index (shard rank, stage index, replica rank or
            server shard's range), or None when the trainer could not tell
            which worker it was.
        kind: "shard", "stage", "replica" or "server shard".

    The worker's own exception is the `__cause__`.
    """

    def __init__(self, kind: str, worker: int | None, cause: BaseException) -> None:
        who = f"{kind} {worker}" if worker is not None else f"a {kind}"
        super().__init__(
            f"{who} lost its weights and optimizer state "
            f"({type(cause).__name__}: {cause}; it was restarted on a fresh device "
            "context); this trainer refuses every request until a checkpoint is "
            "loaded: ask it LoadCheckpoint(path)"
        )
        self.kind = kind
        self.worker = worker
        self.__cause__ = cause


class OtherProcessFailed(RuntimeError):
    """In a job of several processes, another process failed its part of a
    task this process did without error (a trainer's start, a sharded step,
    an evaluation); every process ended the task together, as the message
    says (what was undone or kept). The failing process raised its own
    error, with a note naming its rank."""


class StepLimitError(ValueError):
    """A `Step` past `TrainerConfig.max_steps`: refused, nothing changed."""
