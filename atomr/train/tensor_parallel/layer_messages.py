"""The messages between the tensor-parallel trainer of any model
(`LayerTensorParallelTrainer`) and its `LayerShardActor`s.

`LayerShardProtocol` lists what a shard answers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from atomr.train.core.messages import SetLearningRate

__all__ = [
    "LayerShardProtocol",
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


class LayerShardProtocol:
    """The messages a layer-sharded tensor-parallel shard answers (`LayerShardActor`).

    Every shard holds its part of every layer of the model and the optimizer
    state of that part; a pass runs on all shards at once, and the layers
    meet the other shards mid-pass (the trainer's `ThreadGroup`).

    | message | reply | meaning |
    |---|---|---|
    | `ShardPass(features, labels, train, step)` | `PassResult` | forward of the whole batch, the loss sums (and correct rows of a classification loss); with `train` the backward by d(mean loss)/d(output), keeping the gradients, and the squared norm of the entries this shard counts (replicated ones only on shard 0); no weight changes |
    | `ShardApply(coefficient, token)` | None | scale the gradients by `coefficient` when it is below 1, optimizer step out of place, pending under `token` |
    | `ShardCommit(token)` | None | keep the pending update `token` (any other token changes nothing) |
    | `ShardRollback(token)` | `bool` (something undone) | undo the pending update, if `token` names it |
    | `ShardStateGet()` | `LayerShardState` | the shard's flat parameters, optimizer `state_dict()` and step count |
    | `ShardStateSet(state)` | None | load a `LayerShardState` (a checkpoint); drops a pending update |
    | `SetLearningRate(lr)` | `float`: the rate it replaces (given back if another worker fails) | the optimizer's learning rate |

    Rules a shard keeps: a pass never touches the weights, and an update is
    atomic (`ShardApply` out of place, `ShardCommit` keeps it,
    `ShardRollback` undoes it). If a message fails on a shard, it aborts the
    group first, so that the other shards stop waiting mid-pass at once
    (they answer `Failure(GroupBroken)`). A bad request (a non-finite loss,
    a zero normaliser, a state that does not fit, a message it does not
    handle) is answered with `Failure(exc)` and changes nothing; a device
    failure fails the actor, and its supervisor decides. Other messages go
    to `DeviceActor.receive` (`OnDevice`, with which the trainer fences a
    shard whose pass timed out; anything else is answered with
    `Failure(TypeError)`).

    Attributes:
        messages: the message types above.
    """

    messages: ClassVar[tuple[type, ...]] = (
        ShardPass,
        ShardApply,
        ShardCommit,
        ShardRollback,
        ShardStateGet,
        ShardStateSet,
        SetLearningRate,
    )
