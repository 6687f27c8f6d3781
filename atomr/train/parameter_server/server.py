"""`ServerShard`: a server actor holding weights and optimizer state.

Workers pull `(weights, version)`, compute a gradient on their own data and
push it back with the version they computed it from. The shard applies the
configured optimizer (torch's SGD-momentum, Adam or AdamW; its state lives
here) under one of three consistency models (`Consistency`):

- asynchronous: each push is applied on arrival; `staleness = version -
  worker_version`; a push staler than `max_staleness` is rejected with
  `StaleGradientError` and changes nothing.
- bounded(s) (SSP): as asynchronous, but a worker's pull waits while it has
  pushed more than `s` gradients more than the slowest worker (`WorkerClocks`).
- synchronous (s = 0): pushes are held until every worker has pushed for
  the current version, then averaged (weighted by each batch's normaliser)
  and applied once, which equals one data-parallel step (`SynchronousRound`).
  A worker without a gradient (non-finite loss) sends `AbortPush` instead:
  its round applies nothing and every push of it fails with
  `RoundDroppedError` (a `NonFiniteError`). A round whose update fails here
  fails with `RoundFailedError`; one applied here but failed elsewhere is
  undone by the trainer's `RollbackRound` (the last update stays undoable).
  A push or abort of a round before the current one (late) is dropped with
  `RoundFailedError`, never applied.

In the asynchronous models a push across several shards is held until its
client confirms it or rolls it back (`PushHolding`, `_hold.py`): all or
none. A shard restarted by its supervisor (its state lost) refuses every
push, abort and pull with `WorkerStateLost` until it is given a state.

A push is atomic: its length, finiteness in the shard's dtype and staleness
are checked first, then the optimizer is applied on the device's worker
thread. Bad input is answered with `Failure(exc)`; never a restart for it.
A failure during the update itself (the aggregation, a device error, an
optimizer dying half-way) changes nothing, since the update is written out
of place and swapped in only once complete (`atomr.train._recovery.DoubleBuffer`),
and is answered with `Failure(exc)` too: the pusher gets the typed error, the
shard keeps its weights and version and goes on serving. A push (or abort)
of a trainer round already taken from its worker (`AcceptedRounds`) is
answered without being applied again. The state, its atomic update and its
whole-state messages (`SetServerState`, `SaveCheckpoint`, `LoadCheckpoint`)
are `ShardStore`'s (`_shard_store.py`); `ServerShard` adds the consistency
models and the other messages.

A shard may hold one range of a larger vector: the trainer
(`AsyncParameterServer`) spawns K of them and its workers push and pull
every range, like MXNet's KVStore or ps-lite.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from atomr.accel import Device
from atomr.actor import Failure, Props
from atomr.train._recovery import DoubleBuffer
from atomr.train.core.errors import NonFiniteError, WorkerStateLost
from atomr.train.core.messages import GetWeights, LoadCheckpoint, SaveCheckpoint, SetLearningRate
from atomr.train.core.model.inputs import model_dtype, real_vector
from atomr.train.core.optimizer import OptimizerKind
from atomr.train.core.optimizer_state import Optimizer
from atomr.train.core.validation import detached
from atomr.train.parameter_server._accepted import AcceptedRounds
from atomr.train.parameter_server._clocks import WorkerClocks
from atomr.train.parameter_server._hold import HoldExpired, PushHolding
from atomr.train.parameter_server._push_checks import (
    check_push,
    check_round_id,
    check_staleness,
    check_worker,
)
from atomr.train.parameter_server._round import (
    PendingPush,
    RoundDroppedError,
    SynchronousRound,
    round_failure,
    round_update,
)
from atomr.train.parameter_server._shard_store import as_optimizer_kind
from atomr.train.parameter_server.consistency import Consistency, check_staleness_bound
from atomr.train.parameter_server.messages import (
    AbortPush,
    ConfirmPush,
    GetServerState,
    ParameterServerStats,
    PullWeights,
    PushedWeights,
    PushGradient,
    RollbackRound,
    SetServerState,
    StaleGradientError,
    Stats,
)

__all__ = ["ServerShard"]


class ServerShard(PushHolding):
    """Holds a flat weight vector (or one range of it) and its optimizer;
    answers `PushGradient`, `AbortPush`, `ConfirmPush`, `RollbackRound`,
    `PullWeights`, `Stats`, `GetWeights`, `SaveCheckpoint`,
    `LoadCheckpoint`, `GetServerState`, `SetServerState`.

    Its update runs on the device's worker thread in a hook that subclasses
    may override (an instrumented server, a fault-injected one:
    `atomr.testkit.inject_faults`): `apply_gradients`.

    Args:
        initial_weights: 1-D float array (copied, cast to `dtype`).
        optimizer: an `OptimizerKind`, or a float learning rate for plain SGD
            (the seed crate's form).
        max_staleness: reject pushes with `version - worker_version` above it;
            None accepts any staleness.
        consistency: the consistency model (default asynchronous).
        workers: the number of workers (ids `0..workers-1`); required by the
            bounded and synchronous models.
        device: where the weights live and the optimizer runs.
        gradient_clip: clip each applied gradient to this global L2 norm
            (only exact for a shard holding the whole vector).
        model_config: the model's `Mlp.config()`, written to checkpoints so
            that they load into other trainers (default: a flat vector).
        dtype: what the weights, the optimizer's state and the applied
            gradients are held in: the model's dtype, float32 (default) or
            float64.

    Raises:
        TypeError: bad optimizer type, weights that are not real numbers, or
            a `max_staleness` that is not an integer.
        ValueError: empty weights or ones not finite in `dtype`, a negative
            `max_staleness`, a bounded/synchronous model without `workers >= 1`,
            or a dtype other than float32 or float64.
    """

    def __init__(
        self,
        initial_weights: Any,
        optimizer: OptimizerKind | float,
        max_staleness: int | None = None,
        *,
        consistency: Consistency | None = None,
        workers: int | None = None,
        device: Device | str = "cpu:0",
        gradient_clip: float | None = None,
        model_config: dict[str, Any] | None = None,
        dtype: Any = np.float32,
    ) -> None:
        super().__init__(device)
        self.dtype = model_dtype(dtype)
        weights = real_vector("initial_weights", initial_weights, self.dtype)
        host = detached(weights, initial_weights)  # copied: the caller's may change
        if host.size < 1:
            raise ValueError("initial_weights must be a non-empty vector")
        max_staleness = check_staleness_bound(max_staleness, "max_staleness")
        self.consistency = consistency or Consistency.asynchronous()
        if self.consistency.bound is not None and (
            not isinstance(workers, int) or isinstance(workers, bool) or workers < 1
        ):
            raise ValueError(f"{self.consistency.name} consistency needs workers >= 1")
        self.kind = as_optimizer_kind(optimizer)
        self.max_staleness = max_staleness
        self.n_workers = workers
        self.gradient_clip = gradient_clip
        self.model_config = model_config or {"sizes": [int(host.size)], "activation": "flat"}
        self.n = int(host.size)
        self._initial = host
        self.weights: Any = None
        self.optimizer: Optimizer | None = None
        self.version = 0
        self.applied = 0
        self.pulled = 0
        self.rejected = 0
        self._staleness_sum = 0
        self.max_staleness_seen = 0
        self.max_clock_gap = 0
        slack = self.consistency.bound if self.consistency.is_bounded else None
        self._clocks = WorkerClocks(workers, slack)
        self._round = SynchronousRound(workers or 0)
        self._buffers = DoubleBuffer()
        self._accepted = AcceptedRounds()
        self._staged = None
        self._in_effect = {}
        self._refusing = None
        self._held = None
        self._expired = {}

    @classmethod
    def props(
        cls,
        initial_weights: Any,
        optimizer: OptimizerKind | float,
        max_staleness: int | None = None,
        **options: Any,
    ) -> Props:
        """The `Props` of a server shard (see the class docstring for the arguments).

        Returns:
            The Props.
        """
        return Props(cls, initial_weights, optimizer, max_staleness, **options)

    # -- counters -------------------------------------------------------------

    def stats(self) -> ParameterServerStats:
        """This shard's counters (see `ParameterServerStats`)."""
        avg = self._staleness_sum / self.applied if self.applied else 0.0
        return ParameterServerStats(
            self.version,
            self.applied,
            self.pulled,
            float(avg),
            self.max_staleness_seen,
            self.rejected,
            self.max_clock_gap,
        )

    def post_restart(self, error: BaseException) -> Any:
        """Restarted by its supervisor, the shard has its initial weights and
        the spawn config's optimizer: it lost its state, so it refuses every
        push, abort and pull with `WorkerStateLost` (kind "server shard")
        until it is given a state (`SetServerState`, `LoadCheckpoint`),
        instead of serving the reset weights or holding a push in a round
        whose other pushes were lost with the old instance."""
        self._refuse(lambda: WorkerStateLost("server shard", None, error))
        return super().post_restart(error)

    # -- messages -------------------------------------------------------------

    async def receive(self, message: Any) -> Any:
        """Dispatch a server message (see the class docstring)."""
        await self._ready()
        if self._waits(message):  # a push is held: the rest waits for it
            return None
        if isinstance(message, (PushGradient, AbortPush, PullWeights)):
            refused = self._refusal()
            if refused is not None:
                return Failure(refused)
        if isinstance(message, PushGradient):
            return await self._push(message)
        if isinstance(message, AbortPush):
            return await self._abort(message)
        if isinstance(message, RollbackRound):
            return await self._roll_back(message)
        if isinstance(message, ConfirmPush):
            return await self._confirm(message)
        if isinstance(message, HoldExpired):
            return await self._expire(message)
        if isinstance(message, PullWeights):
            return await self._pull(message)
        if isinstance(message, Stats):
            return self.stats()
        if isinstance(message, GetWeights):
            return await self.on_device(self.backend.to_host, self.weights)
        if isinstance(message, SetLearningRate):
            return await self.on_device(self._set_lr, message.lr)
        if isinstance(message, GetServerState):
            return await self._state_for(message.to_save)
        if isinstance(message, SetServerState):
            return await self._set_state(message.state)
        if isinstance(message, SaveCheckpoint):
            return await self._save(message.path)
        if isinstance(message, LoadCheckpoint):
            return await self._load(message.path)
        return await super().receive(message)

    async def _push(self, msg: PushGradient) -> Any:
        try:  # finite in the shard's dtype: refused before anything changes
            worker, grad, weight, staleness = check_push(
                msg, self.n, self.n_workers, self.version, self.dtype
            )
        except (ValueError, TypeError, NonFiniteError) as exc:
            return Failure(exc)
        if self._accepted.taken(worker, msg.round_id):  # sent again after it landed
            return await self._answer_push(worker, msg.return_weights)
        if self.consistency.is_synchronous:
            return await self._push_sync(worker, grad, weight, staleness, msg)
        bound = self.max_staleness
        if msg.arbitrated_staleness is not None:
            staleness = int(msg.arbitrated_staleness)
        elif bound is not None and staleness > bound:
            self.rejected += 1
            return Failure(StaleGradientError(staleness, bound))
        weights = None
        if weight > 0.0:
            error, weights = await self._apply_or_undo([(grad, 1.0)], msg.return_weights)
            if error is not None:
                return Failure(error)
            # undoable until the next update, should its range fail on another shard
            self._stage([(worker, msg.round_id)], [staleness], undo_takes=False)
            if msg.hold is not None and msg.round_id is not None:  # checked: has one
                self._hold(worker, msg.round_id, msg.hold)  # its clock ticks at the end
        else:
            self._accepted.take([(worker, msg.round_id)])
        if self._held is None:
            await self._batch_done(worker)
        return await self._answer_push(worker, msg.return_weights, weights)

    async def _answer_push(
        self, worker: int, return_weights: bool, weights: np.ndarray | None = None
    ) -> int | PushedWeights:
        """The answer to a push taken (the version), or with `return_weights`
        `PushedWeights` (`weights`, or a copy of the current ones)."""
        if not return_weights:
            return self.version
        self._note_lead(worker)  # the answer serves as this worker's next pull
        if weights is None:
            weights = await self.on_device(self.backend.to_host, self.weights)
        return PushedWeights(self.version, weights)

    async def _push_sync(
        self, worker: int, grad: np.ndarray, weight: float, staleness: int, msg: PushGradient
    ) -> Any:
        if staleness != 0:
            self.rejected += 1
            return Failure(StaleGradientError(staleness, 0, "synchronous mode"))
        grad = detached(grad, msg.gradient)  # held until the round is complete
        reply = self.context.defer()
        pending = PendingPush(grad, weight, reply, None, msg.return_weights, msg.round_id)
        await self._join_round(worker, pending)
        return None

    async def _abort(self, msg: AbortPush) -> Any:
        """`AbortPush`: abort the synchronous round, or tick the worker's clock."""
        try:
            worker = check_worker(msg.worker, self.n_workers)
            round_id = check_round_id(msg.round_id)
            staleness = check_staleness(msg.worker_version, self.version)
        except ValueError as exc:
            return Failure(exc)
        if self._accepted.taken(worker, round_id):  # its push of the round was taken
            return self.version
        if not self.consistency.is_synchronous:
            self._accepted.take([(worker, round_id)])
            await self._batch_done(worker)
            return self.version
        if staleness != 0:
            return Failure(StaleGradientError(staleness, 0, "synchronous mode abort"))
        entry = PendingPush(None, 0.0, self.context.defer(), str(msg.reason), round_id=round_id)
        await self._join_round(worker, entry)
        return None

    async def _join_round(self, worker: int, entry: PendingPush) -> None:
        """Add a push (or abort) to the synchronous round; once every worker is
        in it, apply the round (nothing if it holds an abort) and answer every
        entry. An applied round is kept undoable (`RollbackRound`); one whose
        update failed is answered with `RoundFailedError` (its cause the error)."""
        ordered = self._round.join(worker, entry)
        if ordered is None:
            return
        weights = None
        try:
            parts = round_update(ordered)
        except RoundDroppedError as exc:  # a fresh error per reply: each pusher raises its own
            for _, p in ordered:
                p.reply.set_exception(RoundDroppedError(str(exc)))
            return
        except ValueError as exc:
            error: Exception | None = exc
        else:
            wanted = any(p.wants_weights for _, p in ordered)
            error, weights = await self._apply_or_undo(parts, wanted)
            if error is None:
                entries = [(w, p.round_id) for w, p in ordered]
                self._stage(entries, [0] * len(parts), undo_takes=True)
        for _, p in ordered:
            if error is not None:
                p.reply.set_exception(round_failure(error))
            elif p.wants_weights and weights is not None:
                p.reply.set_result(PushedWeights(self.version, weights))
            else:
                p.reply.set_result(self.version)

    # -- pulls and clocks (bounded staleness) ---------------------------------

    async def _batch_done(self, worker: int) -> None:
        """Tick `worker`'s clock and answer the pulls it frees."""
        self._clocks.tick(worker)
        for waiting, reply in self._clocks.release():
            reply.set_result(await self._answer_pull(waiting))

    async def _pull(self, msg: PullWeights) -> Any:
        try:
            worker = check_worker(msg.worker, self.n_workers)
        except ValueError as exc:
            return Failure(exc)
        if self._clocks.blocked(worker):
            self._clocks.hold(worker, self.context.defer())
            return None
        return await self._answer_pull(worker)

    def _note_lead(self, worker: int) -> None:
        """Weights go to `worker`: keep the largest lead over the slowest worker."""
        self.max_clock_gap = max(self.max_clock_gap, self._clocks.lead(worker))

    async def _answer_pull(self, worker: int) -> tuple[np.ndarray, int]:
        self._note_lead(worker)
        held = self._held is not None  # it may be undone yet: the weights before it
        source = self._buffers.previous if held else self.weights
        weights = await self.on_device(self.backend.to_host, source)
        self.pulled += 1
        return np.asarray(weights), self.version - held
