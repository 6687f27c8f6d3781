"""What a parameter-server shard and worker answer: `ServerShardProtocol`
and `ParameterServerWorkerProtocol`, the message tables of `messages.py`'s
types as each actor serves them."""

from __future__ import annotations

from typing import ClassVar

from atomr.train.core.messages import (
    Evaluate,
    GetWeights,
    LoadCheckpoint,
    SaveCheckpoint,
    SetLearningRate,
)
from atomr.train.parameter_server.messages import (
    AbortPush,
    ConfirmPush,
    GetServerState,
    PullWeights,
    PushGradient,
    RollbackRound,
    SetServerState,
    Stats,
    TrainBatch,
)

__all__ = ["ParameterServerWorkerProtocol", "ServerShardProtocol"]


class ServerShardProtocol:
    """The messages a parameter-server shard answers (`ServerShard`).

    | message | reply | meaning |
    |---|---|---|
    | `PushGradient(worker, worker_version, gradient, weight, arbitrated_staleness, return_weights, round_id, hold)` | the new version (`int`), or `PushedWeights` with `return_weights` | apply (asynchronous, bounded; with `hold`, a push across several shards, held: every other message waits until `ConfirmPush` or `RollbackRound`, or the hold's deadline, when the shard rolls it back itself) or join the round (synchronous: answered once every worker pushed and the round is applied; a round whose update fails here is answered with `Failure(RoundFailedError)`, caused by the error; a push of a round before the current one, the latest `round_id` pushed, is late: answered with `Failure(RoundFailedError)`, never applied, and a push of a later round answers the earlier rounds' pushes still waiting so); a push staler than the bound is answered with `Failure(StaleGradientError)` and changes nothing, one whose gradient is not finite in the shard's dtype (NaN, Inf, or 1e39 to a float32 shard) with `Failure(NonFiniteError)` before it joins a round (the worker may push again); a push of a `round_id` already taken from this worker is answered as that push was and applies nothing |
    | `AbortPush(worker, worker_version, reason, round_id)` | the version (nothing applied); synchronous: `Failure(RoundDroppedError)` (a `NonFiniteError`) for the whole round | sent instead of a push: synchronous, it takes the worker's place in the round, which applies nothing, and every push of the round is answered with the failure (a late abort, of a round before the current one, is answered with `Failure(RoundFailedError)` and drops nothing); asynchronous / bounded, the worker's clock ticks; an abort of a `round_id` already taken from this worker changes nothing |
    | `RollbackRound(round_ids, worker=None)` | `bool`: True when undone | undo the last update if it is the synchronous round of one of `round_ids` (weights, optimizer state, version, counters; the trainer's, for a round that failed elsewhere), or with `worker`, that worker's asynchronous push of one of them (its client's, for a push whose range failed on another shard; its hold ends); a push applied here with another update after it (not held) cannot be undone: `Failure(RoundFailedError)`, and the shard refuses to serve until it is given a state |
    | `ConfirmPush(worker, round_id)` | None (a tell) | the held push is kept by every shard: its hold ends; a confirm of a push this shard rolled back when its hold expired makes it refuse to serve (`RoundFailedError`) until it is given a state |
    | `PullWeights(worker)` | `(weights, version)` | a host copy; under bounded staleness the reply waits while the worker is too far ahead of the slowest |
    | `Stats()` | `ParameterServerStats` | the shard's counters |
    | `GetWeights()` | `ndarray` | a host copy of the shard's range |
    | `SetLearningRate(lr)` | `float`: the rate it replaces (given back if another worker fails) | the optimizer's learning rate |
    | `GetServerState(to_save)` | `ServerState` | weights and optimizer state of the shard's range, the version, and (`refusing`) whether it refuses to serve; with `to_save` (for a checkpoint), a shard that refuses pushes answers its refusal |
    | `SetServerState(state)` | None | replace them (a shard that refused to serve serves again, unless `state` is its own refusing state given back); refused with `Failure(RuntimeError)` while a synchronous round is in progress |
    | `SaveCheckpoint(path)` | None | a checkpoint of the shard's range; a shard that refuses pushes answers its refusal, writing nothing |
    | `LoadCheckpoint(path)` | None | restore it; `Failure(CheckpointError)` if it does not fit |

    Rules a shard keeps: a push is atomic (its worker, length, finiteness
    and staleness are checked first; the update is written out of place and
    swapped in once complete), so any failure, bad input or a failed update,
    is answered with `Failure(exc)` and leaves the weights and version as
    they were; the shard is never restarted for it and goes on serving. It
    takes one push (or abort) per worker and trainer round. Its last update
    stays undoable until the next one (`RollbackRound`), and a held push
    keeps every other message but `Stats` waiting. A shard restarted by
    its supervisor (its state lost) answers every push, abort and pull with
    `Failure(WorkerStateLost)`, and one holding a push it could not undo (or
    missing one the others kept) with
    `Failure(RoundFailedError)`, until it is given a state (`SetServerState`,
    `LoadCheckpoint`; its own state given back, `ServerState.refusing` set
    from its refusal, as a failed load's restore does, leaves it refusing);
    `Stats`, `GetWeights` and `GetServerState` are served,
    but no checkpoint is made of its state (`SaveCheckpoint`, `to_save`).
    Other messages go to `DeviceActor.receive` (`OnDevice`; anything else is
    answered with `Failure(TypeError)`).

    Attributes:
        messages: the message types above.
    """

    messages: ClassVar[tuple[type, ...]] = (
        PushGradient,
        AbortPush,
        RollbackRound,
        ConfirmPush,
        PullWeights,
        Stats,
        GetWeights,
        SetLearningRate,
        GetServerState,
        SetServerState,
        SaveCheckpoint,
        LoadCheckpoint,
    )


class ParameterServerWorkerProtocol:
    """The messages a parameter-server worker answers (`ParameterServerWorker`).

    | message | reply | meaning |
    |---|---|---|
    | `TrainBatch(features, labels, sample_offset, reuse_generation, round_id)` | `BatchResult` | pull the weights of every server range (or, with `reuse_generation`, start from those its last push of the same generation returned), compute the batch's mean gradient on the worker's device and push it with the versions pulled and its `round_id` |
    | `Evaluate(features, labels)` | `EvalResult` | loss and accuracy of the batch at freshly pulled weights; no state changes |

    Rules a worker keeps: a push refused as stale is computed again from
    fresh weights (up to its `stale_retries`, then
    `Failure(StaleGradientError)`); a batch of zero rows pushes an empty
    clock tick (weight 0) and answers an unapplied `BatchResult`; a batch
    without a usable gradient (non-finite loss or gradient) sends
    `AbortPush` instead of a push, so that a synchronous round fails for
    every worker rather than waiting for this one, and answers
    `Failure(NonFiniteError)`; a batch that does not fit the model is
    answered with `Failure(InvalidBatchError)`, and one without a `round_id`
    (an int >= 0) for a worker of several server shards with
    `Failure(ValueError)` before anything is pulled (a push across shards
    that fails on one is rolled back on the others by its round id; the
    trainer numbers every batch). In synchronous mode, weights
    pulled from shards at different versions (a round applied on some only)
    are not computed from: the worker aborts its part and answers
    `Failure(RoundFailedError)`, as it answers a round that failed on a
    shard. In the asynchronous models, a push whose range failed on a
    follower shard was rolled back (`ShardedClient.push`): the worker sends
    `AbortPush` (its batch counts as done for the clocks) and answers
    `Failure(RoundFailedError)`. A shard refusing to serve (its state lost,
    `WorkerStateLost`, or a push it could not undo, `RoundFailedError`) is
    answered with its failure at once. A part sent again after its push
    landed (the shards do not apply a round's push twice) is answered with
    the `BatchResult` computed the first time, even by a restarted worker.
    Between batches a worker keeps at most the weights its last push
    returned (and its last result), so a restarted worker simply pulls on
    its next batch. Other messages go to `DeviceActor.receive` (`OnDevice`;
    anything else is answered with `Failure(TypeError)`).

    Attributes:
        messages: the message types above.
    """

    messages: ClassVar[tuple[type, ...]] = (TrainBatch, Evaluate)
