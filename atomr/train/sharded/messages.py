"""The messages between `ShardedDataParallelTrainer` and its `ShardedReplica`s.

A *handed* buffer (`Handed`) is a host array of one unit's length that a
replica gives its trainer for a collective: on a CPU device the replica's own
memory (the collective then works in it directly, `shared`), else a host
copy, whose result the trainer sends back in the next message.

`ShardedReplicaProtocol` lists what a replica answers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from atomr.train.core.messages import SetLearningRate
from atomr.train.data_parallel.messages import EvaluateShard

__all__ = [
    "ApplyShard",
    "BackwardLayer",
    "CommitShard",
    "ComputeShardGradients",
    "ForwardLayer",
    "GetShardMemory",
    "GetShardState",
    "Handed",
    "LayerForwardResult",
    "RollbackShard",
    "SetFullParams",
    "SetShardState",
    "ShardGradients",
    "ShardLayerParams",
    "ShardMemory",
    "ShardReplicaState",
    "ShardedReplicaProtocol",
]


@dataclass(frozen=True, eq=False)
class Handed:
    """A host buffer handed to the trainer for a collective.

    Attributes:
        buffer: the flat host array (one unit's length).
        shared: it is the replica's own memory: a collective's result needs
            no message back.
    """

    buffer: np.ndarray
    shared: bool


@dataclass(frozen=True, eq=False)
class ComputeShardGradients:
    """Stages 1 and 2: the gradient *sum* of one shard of a batch into the
    replica's full gradient buffer; no weight changes. Answered with
    `ShardGradients`. `sample_offset`: the first row's index in the whole
    batch (dropout masks depend on it)."""

    features: np.ndarray
    labels: np.ndarray
    sample_offset: int = 0


@dataclass(frozen=True, eq=False)
class ShardGradients:
    """A replica's phase-1 result.

    Attributes:
        loss_sum: the shard's loss sum.
        normaliser: the shard's normaliser.
        samples: rows in the shard.
        handed: the full gradient buffer (the whole-vector unit), or None
            for stage 3 (its gradients were handed layer by layer).
    """

    loss_sum: float
    normaliser: float
    samples: int
    handed: Handed | None = None


@dataclass(frozen=True, eq=False)
class ShardLayerParams:
    """Stage 3: a fresh buffer of layer `layer`'s length holding the replica's
    own part of it, for the all-gather before the layer's forward or backward.
    Answered with `Handed`."""

    layer: int


@dataclass(frozen=True, eq=False)
class ForwardLayer:
    """Stage 3: run layer `layer` forward on the gathered parameters, then free them.

    Attributes:
        layer: the layer.
        gathered: the whole layer (None: the replica's own handed buffer,
            gathered in place).
        features, labels: the replica's shard of the batch (layer 0 takes the
            features; the last layer computes the loss against the labels).
        train: keep what the backward pass needs.
        sample_offset: the shard's first row in the whole batch (layer 0's
            message; dropout masks depend on it).
    """

    layer: int
    gathered: np.ndarray | None
    features: np.ndarray | None = None
    labels: np.ndarray | None = None
    train: bool = True
    sample_offset: int = 0


@dataclass(frozen=True, eq=False)
class LayerForwardResult:
    """Stage 3: what the last layer's forward found (None for the others).

    Attributes:
        loss_sum, normaliser: the shard's loss sum and normaliser.
        correct: correctly classified rows (evaluation of a classification loss).
        samples: rows in the shard.
    """

    loss_sum: float
    normaliser: float
    correct: int
    samples: int


@dataclass(frozen=True, eq=False)
class BackwardLayer:
    """Stage 3: first keep the replica's part of the reduced gradient of the
    layer above (`layer + 1`, when there is one), then run layer `layer`
    backward on its gathered parameters and hand over the layer's gradient.
    Answered with `Handed` (the layer's gradient sum).

    Attributes:
        layer: the layer.
        gathered: as for `ForwardLayer`.
        reduced_above: the reduced gradient of layer `layer + 1` when its
            handed buffer was a copy (None: in place, or no layer above).
    """

    layer: int
    gathered: np.ndarray | None
    reduced_above: np.ndarray | None = None


@dataclass(frozen=True, eq=False)
class ApplyShard:
    """Update the replica's piece, kept pending until `CommitShard(token)` or
    `RollbackShard(token)`. Answered with None.

    Attributes:
        reduced: the reduced gradient of the last unit handed over, when that
            buffer was a copy (None: in place).
        scale: `1 / normaliser`: turns the gradient sum into the mean.
        coefficient: the clipping factor from the global norm (1: none).
        token: names this update.
    """

    reduced: np.ndarray | None
    scale: float
    coefficient: float
    token: int


@dataclass(frozen=True, eq=False)
class CommitShard:
    """Keep the pending update `token`. Stages 1 and 2 answer with the full
    parameter buffer (`Handed`) holding the new piece at the replica's
    positions, for the all-gather; stage 3 with None."""

    token: int


@dataclass(frozen=True, eq=False)
class RollbackShard:
    """Undo the pending update `token` (if it is the pending one). Answered
    with True when something was undone."""

    token: int


@dataclass(frozen=True, eq=False)
class SetFullParams:
    """Stages 1 and 2: the gathered parameters, for a replica whose handed
    buffer was a copy."""

    params: np.ndarray


@dataclass(frozen=True, eq=False)
class GetShardState:
    """Answered with the replica's `ShardReplicaState`."""


@dataclass(frozen=True, eq=False)
class ShardReplicaState:
    """A replica's checkpointable state.

    Attributes:
        piece: its owned parameters (host, `ShardLayout` order).
        optimizer: its optimizer's `state_dict()` over the piece.
        steps: optimizer steps applied.
    """

    piece: np.ndarray
    optimizer: dict[str, Any] = field(default_factory=dict)
    steps: int = 0


@dataclass(frozen=True, eq=False)
class SetShardState:
    """Load a state into the replica: its piece and optimizer state, and (stages
    1 and 2) the full parameters. Answered with None.

    Attributes:
        state: the replica's part.
        full: the whole parameter vector (stages 1 and 2), or None.
    """

    state: ShardReplicaState
    full: np.ndarray | None = None


@dataclass(frozen=True, eq=False)
class GetShardMemory:
    """Answered with the replica's `ShardMemory`, measured from the arrays it holds."""


@dataclass(frozen=True)
class ShardMemory:
    """Bytes a replica holds, by role.

    Attributes:
        weights: persistent parameters (the full working copy for stages 1
            and 2, plus the owned piece every stage keeps).
        gradients: persistent gradients (full for stage 1, the piece for 2 and 3).
        optimizer: optimizer state (over the piece).
        undo: the second set of the atomic update (`DoubleBuffer`: a piece
            of parameters and of optimizer state).
        gathered_peak: the largest transient buffer seen: a gathered layer
            (stage 3) or the full gradient between backward and reduce-scatter
            (stage 2).
    """

    weights: int
    gradients: int
    optimizer: int
    undo: int
    gathered_peak: int

    @property
    def persistent(self) -> int:
        """Weights, gradients, optimizer state and undo set together."""
        return self.weights + self.gradients + self.optimizer + self.undo


class ShardedReplicaProtocol:
    """The messages a sharded (ZeRO) replica answers (`ShardedReplica`).

    | message | reply | stage | meaning |
    |---|---|---|---|
    | `ComputeShardGradients(features, labels, sample_offset)` | `ShardGradients` (with the full gradient buffer `Handed`) | 1, 2 | forward, loss and backward of the replica's shard of the batch: the gradient *sum*; no weight changes |
    | `ShardLayerParams(layer)` | `Handed` | 3 | a fresh buffer of the layer's length holding the replica's part of it, for the all-gather |
    | `ForwardLayer(layer, gathered, features, labels, train, sample_offset)` | `LayerForwardResult` (last layer) or None | 3 | the layer forward on its gathered parameters, which are then freed; the last layer computes the loss |
    | `BackwardLayer(layer, gathered, reduced_above)` | `Handed` (the layer's gradient sum) | 3 | keep the replica's part of the reduced gradient of layer `layer + 1`, then the layer backward |
    | `ApplyShard(reduced, scale, coefficient, token)` | None | all | keep the replica's part of the last handed unit's reduced sum, scale it by `scale` (and `coefficient` when below 1), optimizer step of the piece out of place, pending under `token` |
    | `CommitShard(token)` | `Handed` (full parameters, stages 1 and 2) or None (stage 3) | all | keep the pending update `token`; stages 1 and 2 write the new piece into the working copy and hand it over for the all-gather |
    | `RollbackShard(token)` | `bool` (something undone) | all | undo the pending update, if `token` names it |
    | `SetFullParams(params)` | None | 1, 2 | the all-gathered parameters, for a replica whose handed buffer was a copy |
    | `GetShardState()` | `ShardReplicaState` | all | the piece, its optimizer `state_dict()` and the step count (checkpoint save) |
    | `SetShardState(state, full)` | None | all | load a piece, its optimizer state, the step count and (stages 1 and 2) the full parameters; drops a pending update |
    | `GetShardMemory()` | `ShardMemory` | all | bytes held, by role, measured from the arrays |
    | `EvaluateShard(features, labels)` | `ShardEval` | 1, 2 | loss sums and correct rows of one shard (stage 3 evaluates through `ForwardLayer(train=False)`) |
    | `SetLearningRate(lr)` | `float`: the rate it replaces (given back if another worker fails) | all | the piece optimizer's learning rate |

    The handing: a `Handed` buffer is the replica's own memory on a CPU
    device (`shared`: the collective works in it, and no result comes
    back), else a host copy whose reduced or gathered result the trainer
    sends back in the next message (`ApplyShard.reduced`,
    `BackwardLayer.reduced_above`, `ForwardLayer.gathered`,
    `BackwardLayer.gathered`, `SetFullParams`).

    Rules a replica keeps: forward and backward never touch the piece; an
    update is atomic (`ApplyShard` out of place, `CommitShard` keeps it,
    `RollbackShard` undoes it; a `CommitShard` of another token is answered
    with `Failure(ValueError)`). A bad request (a non-finite loss, a wrong
    length, a state that does not fit, a message it does not handle or one
    of another stage's column, `TypeError`) is answered with `Failure(exc)`
    and changes nothing; a device failure fails
    the actor, and its supervisor decides.

    Attributes:
        messages: the message types above.
    """

    messages: ClassVar[tuple[type, ...]] = (
        ComputeShardGradients,
        ShardLayerParams,
        ForwardLayer,
        BackwardLayer,
        ApplyShard,
        CommitShard,
        RollbackShard,
        SetFullParams,
        GetShardState,
        SetShardState,
        GetShardMemory,
        EvaluateShard,
        SetLearningRate,
    )
