"""The messages between the tensor-parallel trainer of any model
(`LayerTensorParallelTrainer`) and its `LayerShardActor`s."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "LayerShardState",
    "PassResult",
    "ShardApply",
    "ShardCommit",
    "ShardPass",
    "ShardRollback",
    "ShardStateGet",
    "ShardStateSet",
]


@dataclass(frozen=True, eq=False)
class ShardPass:
    """Forward (and with `train`, loss gradient and backward) of the whole
    batch on every shard at once; no weight changes. Answered with `PassResult`.

    Attributes:
        features, labels: the validated batch (every shard sees all of it).
        train: a training pass.
        step: the optimizer steps applied so far (dropout masks depend on it).
    """

    features: np.ndarray
    labels: np.ndarray
    train: bool
    step: int = 0


@dataclass(frozen=True)
class PassResult:
    """A shard's pass: the batch's loss sum and normaliser, correct rows or
    tokens, and (training) the squared norm of the gradient entries this
    shard accounts for (replicated entries only on shard 0)."""

    loss_sum: float
    normaliser: float
    correct: int
    squared_norm: float


@dataclass(frozen=True, eq=False)
class ShardApply:
    """Update the shard's parameters by its gradient times `coefficient`
    (clipping), pending until `ShardCommit(token)` / `ShardRollback(token)`."""

    coefficient: float
    token: int


@dataclass(frozen=True, eq=False)
class ShardCommit:
    """Keep the pending update `token`."""

    token: int


@dataclass(frozen=True, eq=False)
class ShardRollback:
    """Undo the pending update `token`, if it is the pending one."""

    token: int


@dataclass(frozen=True, eq=False)
class ShardStateGet:
    """Answered with the shard's `LayerShardState`."""


@dataclass(frozen=True, eq=False)
class LayerShardState:
    """A shard's flat parameters, optimizer state and step count."""

    params: np.ndarray
    optimizer: dict[str, Any] = field(default_factory=dict)
    steps: int = 0


@dataclass(frozen=True, eq=False)
class ShardStateSet:
    """Load a `LayerShardState` into the shard."""

    state: LayerShardState
