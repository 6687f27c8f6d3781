"""The messages of a data-parallel trainer and of its replicas.

`GetReplicaWeights` and `SetReplicas` are messages of `DataParallelTrainer`
(on top of the ones every trainer answers, `atomr.train.core.messages`).
The others are `ReplicaProtocol`: what the trainer sends a replica. The
trainer never looks inside a replica; any actor that answers these is one
(bring your own model, device or framework). `ReplicaActor` is the built-in
replica of any model (a `Sequential`: an `Mlp`, a `gpt(...)`, ...).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from atomr.train.core.messages import GetWeights, SetLearningRate

__all__ = [
    "AllReduceGradients",
    "ApplyGradients",
    "ApplyReducedGradients",
    "ComputeGradients",
    "ComputeReplicaGradients",
    "EvaluateShard",
    "GetDevice",
    "GetDevices",
    "GetGradients",
    "GetReplicaWeights",
    "GetState",
    "GetWorldSize",
    "GradientResult",
    "ReplicaProtocol",
    "ReplicaState",
    "Rollback",
    "SetGradients",
    "SetReplicas",
    "SetState",
    "ShardEval",
    "SyncParams",
    "WeightedAllReduceGradients",
]


# ---------------------------------------------------------------- the trainer's own


@dataclass(frozen=True, slots=True)
class GetReplicaWeights:
    """Ask a data-parallel trainer for each replica's weight vector;
    answered with `list[ndarray]`, in replica order."""


@dataclass(frozen=True, eq=False)
class SetReplicas:
    """Give a data-parallel trainer its replica actors (`ActorRef`s answering
    `ReplicaProtocol`); answered with None once they hold replica 0's weights.
    An open CADENCE or ASYNC round is first closed on the replicas it was
    given to (should it fail, its failure is logged, not answered); an open
    accumulation window is dropped.

    Attributes:
        replicas: the replica references, in rank order.
    """

    replicas: Sequence[Any]


# ---------------------------------------------------------------- ReplicaProtocol


# ------------------------------------ the manual verbs (hand-written loops)


@dataclass(frozen=True, slots=True)
class SyncParams:
    """Give every replica replica 0's weights and optimizer state (in a job,
    process 0's); answered with None."""


@dataclass(frozen=True, eq=False)
class ComputeReplicaGradients:
    """Replica `i` computes the mean gradient of `batches[i]` into its own
    gradient buffer, no weight changed; answered with each replica's mean loss.

    Attributes:
        batches: one `(features, labels)` batch per local replica.
    """

    batches: Sequence[tuple[Any, Any]]


@dataclass(frozen=True, slots=True)
class AllReduceGradients:
    """Every replica's gradient buffer becomes the average of all of them
    (across the job's processes too); answered with the result's L2 norm."""


@dataclass(frozen=True, eq=False)
class WeightedAllReduceGradients:
    """Every replica's gradient buffer becomes `sum(n_i * g_i) / sum(n_i)`
    over all replicas (of every process): the mean gradient of every sample
    when each `g_i` is its replica's mean over `n_i` samples; answered with
    the result's L2 norm.

    Attributes:
        batch_counts: one count per local replica, each >= 0, not all 0.
    """

    batch_counts: Sequence[float]


@dataclass(frozen=True, slots=True)
class ApplyGradients:
    """Every replica's optimizer steps by its own gradient buffer (clipped to
    `TrainerConfig.gradient_clip`), all or none; answered with the gradient's
    norm before clipping."""


@dataclass(frozen=True, slots=True)
class GetWorldSize:
    """Answered with the number of replicas in the job (local replicas times processes)."""


@dataclass(frozen=True, slots=True)
class GetDevices:
    """Answered with this process's replicas' devices, in replica order."""


@dataclass(frozen=True, slots=True)
class GetDevice:
    """Replica protocol: answered with the replica's `Device` (`GetDevices`)."""


@dataclass(frozen=True, slots=True)
class GetGradients:
    """Replica protocol: answered with a host copy of the gradient buffer."""


@dataclass(frozen=True, eq=False)
class SetGradients:
    """Replica protocol: overwrite the gradient buffer; answered with None.

    Attributes:
        gradients: the flat gradient (the parameter vector's length, finite).
    """

    gradients: np.ndarray


@dataclass(frozen=True, eq=False)
class ComputeGradients:
    """Phase 1: forward + backward on a shard, weights untouched; answered
    with `GradientResult`.

    Attributes:
        features: `(rows, in_width)` float array (rows may be 0), or token ids.
        labels: labels or targets of the rows, as for `Step`.
        accumulate: add the gradient to the buffer instead of replacing it.
        return_gradients: put a host view of the gradient buffer in the reply
            (the host collective sums them).
        sample_offset: the first row's index in the whole batch (dropout
            masks depend on it, so replicas draw one device's masks).
        check_gradient: refuse (`NonFiniteError`) a gradient buffer that is
            not finite once the shard's gradient is in it: set for an
            accumulation window's micro-steps before its last, which no
            reduction checks (the single-device `Trainer` refuses them too).
    """

    features: np.ndarray
    labels: np.ndarray
    accumulate: bool = False
    return_gradients: bool = False
    sample_offset: int = 0
    check_gradient: bool = False


@dataclass(frozen=True, eq=False)
class GradientResult:
    """What a replica computed on its shard.

    Attributes:
        loss_sum: the shard's loss sum.
        normaliser: the shard's normaliser (rows, elements for MSE, or the
            sum of the targets' class weights).
        samples: rows in the shard.
        micros: compute time on the device, in microseconds.
        gradients: host view (CPU) or copy (GPU) of the gradient buffer when
            asked for, else None; valid until the replica's next message.
    """

    loss_sum: float
    normaliser: float
    samples: int
    micros: int
    gradients: np.ndarray | None = None


@dataclass(frozen=True, eq=False)
class ApplyReducedGradients:
    """Phase 2: one optimizer step, the old state kept; answered with the global
    gradient norm when the replica finalised its own buffer, else None.

    Attributes:
        gradients: the final gradient (host array), or None to use the
            replica's own buffer after scaling and clipping it.
        scale: factor applied to the own buffer (`1 / total normaliser`).
        clip: clip the own buffer's norm to this value (None: no clipping).
        token: identifies the step for `Rollback`.
    """

    gradients: np.ndarray | None = None
    scale: float = 1.0
    clip: float | None = None
    token: int = 0


@dataclass(frozen=True, slots=True)
class Rollback:
    """Undo the `ApplyReducedGradients` of `token` (swap its old state back); answered
    with True if something was restored.

    Attributes:
        token: the step's token.
    """

    token: int


@dataclass(frozen=True, slots=True)
class GetState:
    """Ask for the replica's full state; answered with `ReplicaState`."""


@dataclass(frozen=True, eq=False)
class ReplicaState:
    """Everything that makes two replicas identical.

    Attributes:
        model: the model config (`Mlp.config()`).
        weights: flat host weight vector.
        optimizer: the optimizer's `state_dict()` (empty: a fresh optimizer).
        steps: optimizer steps applied so far.
    """

    model: dict[str, Any]
    weights: np.ndarray
    optimizer: dict[str, Any] = field(default_factory=dict)
    steps: int = 0


@dataclass(frozen=True, eq=False)
class SetState:
    """Replace the replica's weights, optimizer state and step count;
    answered with None.

    Attributes:
        state: the state to take.
    """

    state: ReplicaState


@dataclass(frozen=True, eq=False)
class EvaluateShard:
    """Loss sums and correct predictions on a shard, nothing changed;
    answered with `ShardEval`.

    Attributes:
        features: `(rows, in_width)` float array (rows may be 0).
        labels: labels or targets, as for `Step`.
    """

    features: np.ndarray
    labels: np.ndarray


@dataclass(frozen=True, slots=True)
class ShardEval:
    """The sums of an evaluation shard.

    Attributes:
        loss_sum: loss sum.
        normaliser: the loss's normaliser.
        correct: rows whose arg-max equals the label (0 for MSE).
        samples: rows.
    """

    loss_sum: float
    normaliser: float
    correct: int
    samples: int


class ReplicaProtocol:
    """The messages a data-parallel replica answers (bring your own replica).

    | message | reply | phase |
    |---|---|---|
    | `ComputeGradients(features, labels, accumulate, return_gradients)` | `GradientResult` | 1: compute, change no weights |
    | `ApplyReducedGradients(gradients, scale, clip, token)` | grad norm (`float`) or None | 2: update, the old state kept |
    | `Rollback(token)` | `bool` (restored) | undo the `ApplyReducedGradients` of `token` |
    | `GetState()` | `ReplicaState` | re-sync source, checkpoint save |
    | `SetState(state)` | None | re-sync target, initial broadcast, checkpoint load (and its undo) |
    | `GetWeights()` | `ndarray` (flat, `Mlp.params` layout) | `GetWeights`, `GetReplicaWeights`, checks |
    | `EvaluateShard(features, labels)` | `ShardEval` | `Evaluate` |
    | `GetGradients()` / `SetGradients(g)` | `ndarray` / None | the manual verbs (`AllReduceGradients`, ...) |
    | `GetDevice()` | `Device` | `GetDevices` |
    | `SetLearningRate(lr)` | `float`: the rate it replaces (given back if another worker fails) | `SetLearningRate` |
    | the ring messages (`atomr.train.comm.ring`) | | only with a collective whose members hold the buffers (`"ring"`) |

    The gradient: `ComputeGradients` leaves in the replica's gradient buffer
    the gradient of its shard's loss *sum* (not the mean): the trainer adds
    the buffers of all replicas and divides once by the total normaliser,
    which is exact for any split. With `accumulate=True` the gradient is
    added to the buffer instead of replacing it (micro-steps of gradient
    accumulation; nothing is exchanged until the last one). A shard may
    have 0 rows (a batch smaller than the number of replicas): the replica
    then contributes a zero gradient (or leaves its accumulated one as is).

    The update: `ApplyReducedGradients(gradients=g)` applies the given final
    gradient; `ApplyReducedGradients(gradients=None, scale=s, clip=c)` first
    turns the replica's *own* buffer (which holds the all-reduced sum after a
    ring all-reduce) into the final gradient: multiply by `s`, take the
    global norm, refuse with `NonFiniteError` (nothing changed) if it is not
    finite, clip to `c`, and answer with the norm. Either way the replica
    keeps its old weights and optimizer state under `token`, so that
    `Rollback(token)` can undo the update if another replica failed to apply
    it. Every replica applies the same bits with the same optimizer, so the
    replicas stay bit-identical.

    Bad requests are answered with `Failure(exc)` and change nothing; a
    device failure fails the actor (its supervisor restarts it and the
    trainer re-syncs it with `SetState` from a healthy replica).

    The built-in replica is `ReplicaActor`.

    Attributes:
        messages: the message types of the table (the ring's aside).
    """

    messages: ClassVar[tuple[type, ...]] = (
        ComputeGradients,
        ApplyReducedGradients,
        Rollback,
        GetState,
        SetState,
        GetWeights,
        EvaluateShard,
        GetGradients,
        SetGradients,
        GetDevice,
        SetLearningRate,
    )

    @classmethod
    def handles(cls, message: object) -> bool:
        """True for a message of the table (the ring's aside)."""
        return isinstance(message, cls.messages)
