"""The parameter-server protocol: messages, replies and the stale-gradient error.

| message (to the trainer, `AsyncParameterServer`) | reply |
|---|---|
| `Step`, `Evaluate`, `GetWeights`, `SaveCheckpoint`, `LoadCheckpoint` | as for every trainer (`atomr.train.core.messages`) |
| `TrainEpochs(features, labels, epochs, batch_size, seed=0, test=None)` | `list[EpochReport]` |
| `GetServerStats()` | `list[ParameterServerStats]`, one per server shard |

What a server shard answers is `ServerShardProtocol`, what a worker
answers `ParameterServerWorkerProtocol` (both in `protocols.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from atomr._arguments import INDEX_MAX, int_at_least
from atomr.train.core.stats import StepStats

__all__ = [
    "AbortPush",
    "BatchResult",
    "ConfirmPush",
    "EpochReport",
    "GetServerState",
    "GetServerStats",
    "ParameterServerStats",
    "PullWeights",
    "PushGradient",
    "PushedWeights",
    "RollbackRound",
    "ServerState",
    "SetServerState",
    "StaleGradientError",
    "Stats",
    "TrainBatch",
    "TrainEpochs",
]


class StaleGradientError(ValueError):
    """A pushed gradient was computed from weights too old to apply; nothing
    changed: pull fresh weights and compute it again.

    Attributes:
        staleness: server version minus the worker's version.
        max_staleness: the bound it exceeded (0 in synchronous mode).
    """

    def __init__(self, staleness: int, max_staleness: int, detail: str = "") -> None:
        self.staleness = int(staleness)
        self.max_staleness = int(max_staleness)
        msg = (
            f"stale gradient: staleness {staleness} exceeds max_staleness {max_staleness}; "
            "pull fresh weights and recompute"
        )
        super().__init__(msg + (f" ({detail})" if detail else ""))


@dataclass(frozen=True, eq=False)
class PushGradient:
    """Push one gradient to a server; answered with the server's new version.

    Attributes:
        worker: the worker's id (an int in `[0, workers)` when the server
            knows its workers).
        worker_version: the version of the weights the gradient was computed
            from (as returned by `PullWeights`).
        gradient: the mean gradient of the worker's batch, a 1-D float array
            as long as the server's weight vector (never truncated or padded).
        weight: the batch's loss normaliser (its sample count for
            cross-entropy); synchronous mode averages `sum(w_i g_i) / sum(w_i)`,
            which is exact for uneven batches. 0 marks an empty batch: a clock
            tick that applies nothing.
        arbitrated_staleness: set only on the follower shards of a sharded
            push: the staleness the first shard accepted, which a follower
            counts instead of checking its own (every shard applies it).
        return_weights: answer with `PushedWeights` (the version and the
            weights this push left, copied in the update's device job)
            instead of the version alone: the worker's next pull, saved.
        round_id: the trainer's round of the part (`TrainBatch.round_id`), or
            None. A shard takes one push (or abort) per worker and round: a
            push of a round it took already for this worker (the part sent
            again after its push landed) is answered as that push was, with
            the shard's version (and weights), and applies nothing.
        hold: None, or (an asynchronous push across several shards, with a
            `round_id`) the seconds > 0 (inf: no limit) the shard holds it
            undoable (`_hold.py`) awaiting `ConfirmPush` or `RollbackRound`.
    """

    worker: int
    worker_version: int
    gradient: np.ndarray
    weight: float = 1.0
    arbitrated_staleness: int | None = None
    return_weights: bool = False
    round_id: int | None = None
    hold: float | None = None


@dataclass(frozen=True, slots=True)
class ConfirmPush:
    """Told by a push's client once every shard applied it: the hold ends
    (`PushGradient.hold`). Confirming a push this shard rolled back when its
    hold expired makes it refuse to serve until given a state (`_hold.py`).

    Attributes:
        worker: the pushing worker's id.
        round_id: the push's `round_id`.
    """

    worker: int
    round_id: int


@dataclass(frozen=True, eq=False)
class PushedWeights:
    """The answer to a `PushGradient` with `return_weights`.

    Attributes:
        version: the server's version after the push (as a plain push answers).
        weights: the server's weights at that version (read-only: shared
            by every worker of a synchronous round).
    """

    version: int
    weights: np.ndarray


@dataclass(frozen=True, slots=True)
class AbortPush:
    """Sent instead of a `PushGradient` by a worker without a (finite) gradient.

    - synchronous: it takes the worker's place in the current round; the
      round applies nothing and every push of it (this one included) is
      answered with `Failure(NonFiniteError)` naming the worker and `reason`;
      the next round starts empty. A stale abort (`worker_version` older
      than the server's) gets `Failure(StaleGradientError)`, changing nothing.
    - asynchronous / bounded: nothing is applied, but the batch counts as
      done for the worker's clock (bounded staleness does not hold the
      others back for it); answered with the version.

    Attributes:
        worker: the worker's id.
        worker_version: the version of the weights the worker pulled.
        reason: why there is no gradient (e.g. "loss is not finite (inf)").
        round_id: the trainer's round of the part, as for `PushGradient`: an
            abort of a round the shard took already for this worker changes
            nothing and is answered with the version.
    """

    worker: int
    worker_version: int
    reason: str
    round_id: int | None = None


@dataclass(frozen=True, slots=True)
class RollbackRound:
    """Undo an update that a server shard applied but that failed elsewhere;
    answered with True when the shard's last update holds it and is undone
    (weights, optimizer state, version and counters as before it), else
    False (nothing of it to undo here). A shard keeps its last update
    undoable until its next one (`DoubleBuffer`): an update is kept by
    every shard or by none:

    - synchronous (`worker` None): a round holding a push of one of
      `round_ids`, which failed on another shard or for a worker; the
      trainer rolls a failed round back on every shard. Its pushes are no
      longer taken.
    - asynchronous (`worker` set): that worker's push of one of
      `round_ids`, failed on another shard, which its client rolls back on
      every shard holding it (`PushGradient.hold`); it stays taken (an
      aborted batch). One with another update after it (not held) cannot
      be undone: `Failure(RoundFailedError)`, and the shard refuses to
      serve until it is given a state (`SetServerState`, `LoadCheckpoint`).

    Attributes:
        round_ids: the trainer's rounds of the failed request.
        worker: the worker whose push is undone, or None for whole rounds.
    """

    round_ids: tuple[int, ...]
    worker: int | None = None


@dataclass(frozen=True, slots=True)
class PullWeights:
    """Ask for the current weights; answered with `(weights, version)`
    (a host copy). Under bounded staleness the reply waits while the worker
    is more than `s` clocks ahead of the slowest worker.

    Attributes:
        worker: the worker's id.
    """

    worker: int


@dataclass(frozen=True, slots=True)
class Stats:
    """Ask a server for its `ParameterServerStats`."""


@dataclass(frozen=True, slots=True)
class ParameterServerStats:
    """Counters of one server.

    Attributes:
        version: optimizer steps applied (the weights' version).
        gradients_applied: gradients folded into the weights (in synchronous
            mode each step folds one gradient per worker).
        weights_pulled: `PullWeights` answered.
        avg_staleness: mean staleness (version - worker_version) of the
            applied gradients; 0.0 before any.
        max_staleness_seen: the largest staleness applied.
        gradients_rejected: pushes refused as stale.
        max_clock_gap: the largest lead (in pushes) over the slowest worker
            with which weights were given (pulled, or `PushedWeights`;
            bounded staleness keeps it <= s).
    """

    version: int
    gradients_applied: int
    weights_pulled: int
    avg_staleness: float
    max_staleness_seen: int = 0
    gradients_rejected: int = 0
    max_clock_gap: int = 0


@dataclass(frozen=True, slots=True)
class GetServerState:
    """Ask a server shard for its `ServerState` (the trainer checkpoints from
    them, and snapshots them before a load); that of a shard refusing to
    serve (restarted, or holding half of a push) says so (`refusing`).

    Attributes:
        to_save: the state is for a checkpoint: such a shard answers its
            refusal instead, so that no checkpoint holds such a state.
    """

    to_save: bool = False


@dataclass(frozen=True, eq=False)
class ServerState:
    """Weights and optimizer state of one server shard's range.

    Attributes:
        weights: a host copy of the range's weights.
        optimizer: the optimizer's `state_dict()` for the range.
        version: the server's version.
        refusing: None, or (a shard refusing to serve: `GetServerState`)
            what makes the error it refused with; given this state back
            (`SetServerState`, a failed load's restore) it keeps refusing.
    """

    weights: np.ndarray
    optimizer: dict[str, Any] = field(default_factory=dict)
    version: int = 0
    refusing: Callable[[], Exception] | None = None


@dataclass(frozen=True, eq=False)
class SetServerState:
    """Replace a server's weights, optimizer state and version; answered with
    None, or a `Failure(ValueError)` that changes nothing. The shard serves
    from then on, unless the state is one it refused to serve with
    (`ServerState.refusing`): given back, it keeps refusing so.

    Attributes:
        state: the new state (same range length, same optimizer kind).
    """

    state: ServerState


@dataclass(frozen=True, eq=False)
class TrainBatch:
    """Ask a worker to pull weights, compute the gradient of this batch on its
    device and push it; answered with `BatchResult` once the push is
    accepted (zero rows: an empty clock tick).

    Attributes:
        features: float array `(batch, in_width)` (or token ids).
        labels: labels or targets, as for `Step`.
        sample_offset: the first row's index in the whole batch (dropout
            masks depend on it).
        reuse_generation: None: pull fresh weights first. An int: the worker
            may start from the weights its previous push returned, if that
            push was made for a batch of the same generation, and asks its
            push to return the weights for the next one. The trainer sets it
            in synchronous mode only, and gives a new generation whenever the
            server's weights may have changed otherwise (a checkpoint loaded).
        round_id: the trainer's id of the global batch this part belongs to
            (increasing), sent with the push (`PushGradient.round_id`): a
            part sent again after its push landed is not applied twice.
            None: not deduplicated, and for a worker of one server shard
            only (a worker of several refuses it: a push that failed on one
            shard could not be rolled back on the others).
    """

    features: np.ndarray
    labels: np.ndarray
    sample_offset: int = 0
    reuse_generation: int | None = None
    round_id: int | None = None


@dataclass(frozen=True, slots=True)
class BatchResult:
    """A worker's answer to `TrainBatch`.

    Attributes:
        stats: the batch's `StepStats`: `loss` is its mean loss, `grad_norm`
            the L2 norm of its mean gradient (before any clipping on the
            server), `applied` False for an empty batch.
        normaliser: the batch's loss normaliser (its sample count for an
            unweighted loss; 0 for an empty batch, or one whose targets all
            have class weight 0). The trainer weights the batches' losses by it.
    """

    stats: StepStats
    normaliser: float


@dataclass(frozen=True, slots=True)
class GetServerStats:
    """Ask the trainer for every shard's `ParameterServerStats` (a list)."""


@dataclass(frozen=True, eq=False)
class TrainEpochs:
    """Ask the trainer to train `epochs` passes over a data set, letting every
    worker run through its parts of the batches at its own pace (only the
    consistency model holds them back); answered with `list[EpochReport]`.

    Each epoch shuffles the data (seeded with `seed` plus the trainer's epoch
    number, over every `TrainEpochs` it answered), cuts it into global
    batches of `batch_size` split among the workers. A set that does not fit
    changes nothing. A trainer with `TrainerConfig.max_steps` refuses it
    (`ValueError`): the workers' own pace cannot stop there; `Step` does.

    Attributes:
        features: float array `(samples, in_width)`.
        labels: labels or targets, as for `Step`.
        epochs: number of epochs (>= 1).
        batch_size: global batch size (>= 1), split among the workers.
        seed: base of the shuffles' seeds.
        test: an optional `(features, labels)` test set evaluated after each epoch.

    Raises:
        ValueError: `epochs`, `batch_size` or `seed` is not a suitable int.
    """

    features: np.ndarray
    labels: np.ndarray
    epochs: int
    batch_size: int
    seed: int = 0
    test: tuple[np.ndarray, np.ndarray] | None = None

    def __post_init__(self) -> None:
        for name, low in (("epochs", 1), ("batch_size", 1), ("seed", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
            int_at_least(name, value, low, high=None if name == "seed" else INDEX_MAX)


@dataclass(frozen=True, slots=True)
class EpochReport:
    """One epoch of a `TrainEpochs`.

    Attributes:
        epoch: the trainer's 1-based epoch number.
        loss: mean training loss of the epoch's batches (weighted by each
            part's loss normaliser: its sample count for an unweighted loss).
        version: the first server shard's version at the end of the epoch.
        gradients_applied: gradients applied so far (first server shard).
        avg_staleness: mean staleness so far (first server shard).
        test_loss, test_accuracy: on the test set, NaN without one.
        seconds: wall time of the epoch's training.
        retries: batches sent again after a worker failed.
    """

    epoch: int
    loss: float
    version: int
    gradients_applied: int
    avg_staleness: float
    test_loss: float
    test_accuracy: float
    seconds: float
    retries: int
