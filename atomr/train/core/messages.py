"""Messages every trainer answers (frozen dataclasses).

| message | reply |
|---|---|
| `Step(features, labels)` | `StepStats` |
| `GetWeights()` | `ndarray` (the flat `Mlp.params` layout) |
| `Evaluate(features, labels)` | `EvalResult` |
| `SaveCheckpoint(path)` | `None` once the file is durable |
| `LoadCheckpoint(path)` | `None` once weights and optimizer state are restored |

A trainer whose `TrainingState.rounds` is True (data parallel under
`ApplyPolicy.CADENCE` or `ASYNC`) also answers `CloseRound()` with the
open round's `StepStats`, or None when none is open.

Strategy-specific messages live in each strategy's package (e.g.
`atomr.train.data_parallel.messages`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

__all__ = [
    "CloseRound",
    "Evaluate",
    "GetTrainingState",
    "GetWeights",
    "LoadCheckpoint",
    "SaveCheckpoint",
    "SetLearningRate",
    "Step",
]


@dataclass(frozen=True, eq=False)
class Step:
    """Run one training step on a batch; answered with `StepStats`.

    Attributes:
        features: float array `(batch, *input_shape)`, or int token ids
            `(batch, T)` for a token model.
        labels: one per output row of the model (`validate_targets`): int
            class labels `(batch,)` for an output `(batch, classes)`,
            `(batch, T)` for `(batch, T, classes)`; or float targets shaped
            like the output for MSE.
    """

    features: np.ndarray
    labels: np.ndarray


@dataclass(frozen=True, slots=True)
class GetTrainingState:
    """Ask a trainer where it stands; answered with a `TrainingState` (steps
    applied, `max_steps`, whether this process coordinates the job)."""


@dataclass(frozen=True, slots=True)
class CloseRound:
    """Close the trainer's open round now (its batches so far applied, or
    averaged, as a shorter round); answered with that round's `StepStats`,
    or None when no batch was handed out since the last round. Only for a
    trainer whose `Step`s answer before their batch is applied
    (`TrainingState.rounds`); `fit` sends it at every epoch's end, so the
    epoch's figures include its last round."""


@dataclass(frozen=True, slots=True)
class SetLearningRate:
    """Set the optimizer's base learning rate on every worker; answered with
    None. Under a schedule, the schedule goes on multiplying the new base
    rate (`OptimizerKind.lr_at`). Checkpoints store the new rate.

    Attributes:
        lr: the new base learning rate (checked by the trainer as
            `OptimizerKind.with_lr` checks it, then in the model's dtype,
            `OptimizerKind.check_dtype`: a wrong type is refused with
            `TypeError`, a bad value, `1e39` for a float32 model included,
            with `ValueError`, nothing changed).
    """

    lr: float


@dataclass(frozen=True, slots=True)
class GetWeights:
    """Ask for the full flat weight vector (a host copy); answered with an ndarray."""


@dataclass(frozen=True, eq=False)
class Evaluate:
    """Compute loss and accuracy on a batch without changing any state;
    answered with `EvalResult`.

    Attributes:
        features: float array `(batch, in_width)`.
        labels: labels or targets, as for `Step`.
    """

    features: np.ndarray
    labels: np.ndarray


@dataclass(frozen=True, slots=True)
class SaveCheckpoint:
    """Write weights, optimizer state, step count and model config to `path`
    atomically; answered with None once durable.

    Raises:
        TypeError, ValueError: `path` is not a str or path, or is empty.

    Attributes:
        path: file to write (replaced atomically if it exists).
    """

    path: str | os.PathLike[str]

    def __post_init__(self) -> None:
        _check_path("SaveCheckpoint", self.path)


@dataclass(frozen=True, slots=True)
class LoadCheckpoint:
    """Restore weights, optimizer state and step count from `path`; answered
    with None, or a `CheckpointError` failure (corrupted, truncated, or made
    for another model shape) that leaves the trainer unchanged.

    Raises:
        TypeError, ValueError: `path` is not a str or path, or is empty.

    Attributes:
        path: file written by `SaveCheckpoint` (from any trainer).
    """

    path: str | os.PathLike[str]

    def __post_init__(self) -> None:
        _check_path("LoadCheckpoint", self.path)


def _check_path(message: str, path: object) -> None:
    """Raises: TypeError: not a str or path; ValueError: the empty path."""
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"{message}.path must be a str or os.PathLike, got {type(path).__name__}")
    if os.fspath(path) == "":
        raise ValueError(f"{message}.path is empty")
