"""`ShardStore`: what a server shard holds (the weights, the optimizer's
state and the version) and the only ways they change: an atomic update, the
undoing of the last update, and a whole-state replacement.

An update sums its parts, checks the sum finite, clips it and runs one
optimizer step out of place (`atomr.train._recovery.DoubleBuffer`): any
failure changes nothing, and is handed back to the caller as a value to
answer with, so the shard is never restarted for it. The old weights and
optimizer state are kept until the next update (`DoubleBuffer.apply`
commits the pending one first), so that the last update (a synchronous
round, or an asynchronous push) can be rolled back (`StagedRound`,
`_roll_back_round`) when it failed on another shard.

A shard whose state is known to be wrong refuses every push, abort and pull
(`_refusal`) until it is given a whole state (`_commit_state`: a
`SetServerState`, a `LoadCheckpoint`; not its own state given back, as a
failed load's restore does: `ServerState.refusing`): one restarted by its supervisor (it
lost its weights and optimizer state: `WorkerStateLost`), or one that holds
an asynchronous push that failed on another shard and can no longer be
undone here, or lacks one the others kept (`RoundFailedError`, `_hold.py`).

A whole state comes from `SetServerState` or `LoadCheckpoint`, and
`SaveCheckpoint` writes it (`_set_state`, `_load`, `_save`).

Everything here but `_ready`, `_apply_or_undo`, `_stage`, `_roll_back_round`,
`_refusal`, `_refuse`, `_count_applied`, `_set_state`, `_save` and `_load`
(the event loop's) runs on the device's worker thread. The update is a hook subclasses may override (an
instrumented server, a fault-injected one: `atomr.testkit.inject_faults`):
`apply_gradients`.

`ServerShard` (server.py) is the actor: it builds the store in its
constructor and adds the consistency models, the synchronous round, the
worker clocks and the messages on top.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from atomr.accel import DeviceActor
from atomr.actor import Failure
from atomr.train._recovery import DoubleBuffer
from atomr.train.core.checkpoint import CheckpointError, save_checkpoint
from atomr.train.core.clip import clip_grad_norm
from atomr.train.core.device_guard import Rejected, guarded
from atomr.train.core.errors import NonFiniteError
from atomr.train.core.model.inputs import real_vector
from atomr.train.core.optimizer import OptimizerKind
from atomr.train.core.optimizer_state import Optimizer
from atomr.train.core.sharded_index import merge_shards
from atomr.train.parameter_server._accepted import AcceptedRounds
from atomr.train.parameter_server._checkpoint import checkpoint_of, server_states
from atomr.train.parameter_server._round import RoundFailedError, StagedRound, SynchronousRound
from atomr.train.parameter_server.messages import ServerState

__all__ = ["ShardStore", "as_optimizer_kind"]


def as_optimizer_kind(optimizer: OptimizerKind | float) -> OptimizerKind:
    """The store's optimizer: an `OptimizerKind`, or a float learning rate
    for plain SGD (the seed crate's form).

    Raises:
        TypeError: anything else.
    """
    if isinstance(optimizer, OptimizerKind):
        return optimizer
    if isinstance(optimizer, (int, float)) and not isinstance(optimizer, bool):
        return OptimizerKind.sgd(float(optimizer))
    raise TypeError(f"optimizer must be an OptimizerKind or a learning rate, got {optimizer!r}")


class ShardStore(DeviceActor):
    """The state of a server shard and its atomic updates (module docstring).

    It has no constructor of its own: `ServerShard.__init__` sets every
    attribute below.
    """

    n: int
    dtype: np.dtype
    kind: OptimizerKind
    gradient_clip: float | None
    weights: Any
    optimizer: Optimizer | None
    version: int
    applied: int
    max_staleness_seen: int
    _initial: np.ndarray
    _staleness_sum: int
    _buffers: DoubleBuffer
    _accepted: AcceptedRounds
    _staged: StagedRound | None
    _round: SynchronousRound
    model_config: dict[str, Any]
    # the round of each worker's last asynchronous push applied here and not undone
    _in_effect: dict[int, int]
    # makes the error every push, abort and pull is refused with (None: served)
    _refusing: Callable[[], Exception] | None
    # per worker, the round of its push rolled back when its hold expired (`_hold.py`)
    _expired: dict[int, int]

    def _build(self) -> None:
        """On the device thread: weights and optimizer state on the device."""
        be = self.backend
        self.weights = be.to_device(self._initial)
        self.optimizer = self.kind.create(self.n, be, self.dtype)

    async def _ready(self) -> None:
        if self.weights is None:
            await self.on_device(self._build)

    def _set_lr(self, lr: float) -> float:
        """`SetLearningRate` (device thread): the rate of the later updates,
        kept in `kind` too (what a loaded state is checked against); returns
        the rate it replaces. A restarted shard has the spawn config's rate."""
        assert self.optimizer is not None
        old = self.optimizer.set_lr(lr)
        self.kind = self.optimizer.kind
        return old

    # -- updates ----------------------------------------------------------------

    async def _apply_or_undo(
        self, parts: list[tuple[np.ndarray, float]], copy_out: bool = False
    ) -> tuple[Exception | None, np.ndarray | None]:
        """Apply `parts` atomically: any failure in `apply_gradients`
        (aggregation, a device error mid-optimizer) changes nothing and is
        returned, so the pusher gets the typed error and the shard keeps its
        weights, optimizer state and version; one raised after the new
        weights were swapped in (copying them out) undoes the update.
        Any update ends the undoability of the last round (`_stage`).

        Returns:
            `(error or None, the new weights (read-only) when copy_out, else None)`.
        """
        self._staged = None  # a new update: the last round is kept for good
        job = self._apply_and_copy if copy_out else self.apply_gradients
        version = self.version
        try:  # a refused update (NonFiniteError) comes back as itself
            result = await self.on_device(guarded, job, parts, errors=(NonFiniteError,))
        except Exception as exc:  # answered, never a restart
            if self.version != version:  # it failed after the swap: undone
                await self.on_device(self._undo_last)
            return exc, None
        if isinstance(result, Rejected):
            return result.error, None
        if isinstance(result, Exception) or result is None:
            return result, None
        return None, result

    def _undo_last(self) -> None:
        """On the device thread: undo the update `apply_gradients` swapped in last."""
        self._buffers.rollback()
        self.version -= 1

    def _apply_and_copy(self, parts: list[tuple[np.ndarray, float]]) -> Exception | np.ndarray:
        """`apply_gradients`, then (if applied) a read-only host copy of the new weights."""
        error = self.apply_gradients(parts)
        if error is not None:
            return error
        weights = self.backend.to_host(self.weights)
        weights.flags.writeable = False
        return weights

    def apply_gradients(self, parts: list[tuple[np.ndarray, float]]) -> Exception | None:
        """On the device thread: `sum(coef * g)`, checked finite, then one
        optimizer step, out of place: an exception raised here changes nothing
        (the pusher gets it). The step stays undoable until the next one.

        Args:
            parts: the gradients of the update and their coefficients.

        Returns:
            None when applied, else the `NonFiniteError` it was refused with
            (nothing changed).
        """
        assert self.optimizer is not None
        be = self.backend
        with np.errstate(over="ignore", invalid="ignore"):
            if len(parts) == 1 and parts[0][1] == 1.0:
                total = np.ascontiguousarray(parts[0][0], dtype=self.dtype)
            else:
                acc = np.zeros(self.n, dtype=np.float64)
                for g, coef in parts:
                    acc += coef * g.astype(np.float64, copy=False)
                total = acc.astype(self.dtype)
            if not np.isfinite(total).all():
                return NonFiniteError("gradient holds NaN or Inf; nothing applied")
        grads = be.to_device(total)
        if self.gradient_clip is not None:
            clip_grad_norm(be, grads, self.gradient_clip)
        # out of place, swapped in only when complete: a failure changes nothing
        self._buffers.apply(be, self, "weights", self.optimizer, grads)
        self.version += 1
        return None

    def _count_applied(self, stalenesses: list[int]) -> None:
        self.applied += len(stalenesses)
        self._staleness_sum += sum(stalenesses)
        self.max_staleness_seen = max([self.max_staleness_seen, *stalenesses])

    # -- the last update, undoable -----------------------------------------------

    def _stage(
        self,
        pushes: list[tuple[int, int | None]],
        stalenesses: list[int],
        *,
        undo_takes: bool,
    ) -> None:
        """The update just applied holds `pushes` (`(worker, round_id)`: a
        synchronous round's, or one asynchronous push), applying one gradient
        per staleness in `stalenesses`: count them, take the pushes and keep
        the update undoable (`_roll_back_round`). `undo_takes`: undoing it
        forgets the takes too (a synchronous round); else they stay (an
        asynchronous push undone counts as an aborted batch)."""
        before = (self.applied, self._staleness_sum, self.max_staleness_seen)
        self._count_applied(stalenesses)
        taken_before = self._accepted.take(pushes)
        named = frozenset((w, r) for w, r in pushes if r is not None)
        self._staged = StagedRound(named, taken_before if undo_takes else None, before)
        if not undo_takes:
            self._in_effect.update(named)

    async def _roll_back_round(
        self, round_ids: tuple[int | None, ...], worker: int | None = None
    ) -> bool:
        """`RollbackRound`: undo the last update if it holds a push of one of
        `round_ids` (of `worker` only, unless None): weights, optimizer
        state, version, counters (and taken pushes, for a synchronous round).

        Returns:
            True when it was undone; False when there was nothing of it to undo.

        Raises:
            RoundFailedError: `worker`'s push of one of `round_ids` was applied
                here but another update came after it, so it cannot be undone;
                the shard refuses every push, abort and pull from now on
                (`_refuse`) until it is given a state.
            Exception: the device's failure undoing it (the shard is then
                resumed or restarted by its supervisor).
        """
        staged = self._staged
        if staged is None or not staged.holds(round_ids, worker):
            held = None if worker is None else self._in_effect.get(worker)
            if held is not None and held in round_ids:  # applied here, another update on it
                error = _held_for_good(worker, held)
                self._refuse(error)
                raise error()
            return False
        self._staged = None
        await self.on_device(self._undo_last)
        self.applied, self._staleness_sum, self.max_staleness_seen = staged.counters_before
        if staged.taken_before is not None:
            self._accepted.restore(staged.taken_before)
        for w, r in staged.pushes:
            if self._in_effect.get(w) == r:
                del self._in_effect[w]
        return True

    # -- refusing a wrong state -------------------------------------------------

    def _refuse(self, error: Callable[[], Exception]) -> None:
        """Refuse every push, abort and pull with `error()` (a fresh one each
        time) until a whole state is committed (`_commit_state`)."""
        self._refusing = error

    def _refusal(self) -> Exception | None:
        """The error to refuse a push, abort or pull with now, or None (served)."""
        return None if self._refusing is None else self._refusing()

    # -- whole state ------------------------------------------------------------

    def _server_state(self) -> ServerState:
        assert self.optimizer is not None
        weights = np.asarray(self.backend.to_host(self.weights))
        return ServerState(weights, self.optimizer.state_dict(), self.version, self._refusing)

    def _commit_state(self, state: ServerState) -> None:
        """On the device thread: check everything, then replace weights,
        optimizer, version, and the refusal (`_refuse`): none, unless `state`
        is one this shard refused to serve with, given back (a failed load's
        restore): its state is still known to be wrong.

        Raises:
            TypeError: weights that are not real numbers (nothing changed).
            ValueError: the wrong number of weights, weights not finite in
                the shard's dtype (`real_vector`), or an optimizer state that
                does not fit (nothing changed).
        """
        w = real_vector("the state's weights", state.weights, self.dtype)
        if w.shape[0] != self.n:
            raise ValueError(f"state holds {w.shape[0]} weights, server has {self.n}")
        fresh = self.kind.create(self.n, self.backend, self.dtype)
        try:
            fresh.load_state_dict(state.optimizer)
        except (KeyError, TypeError) as exc:
            raise ValueError(f"optimizer state does not fit: {exc!r}") from exc
        self._buffers.commit()  # the last update can no longer be undone
        self._staged = None
        self._in_effect.clear()
        self._expired.clear()
        self._refusing = state.refusing
        self.backend.upload(w, self.weights)
        self.optimizer = fresh
        self.kind = fresh.kind
        self.version = int(state.version)

    async def _set_state(self, state: Any) -> Any:
        """`SetServerState`: replace the whole state (`_commit_state`), not
        while a synchronous round is in progress."""
        if self._round.in_progress:
            return Failure(RuntimeError("a synchronous round is in progress; try again after it"))
        if not isinstance(state, ServerState):
            return Failure(TypeError(f"expected a ServerState, got {type(state).__name__}"))
        try:
            return await self.on_device(self._commit_state, state)
        except (ValueError, TypeError) as exc:
            return Failure(exc)

    async def _state_for(self, to_save: bool) -> ServerState | Failure:
        """`GetServerState`: the state, or (`to_save`) the refusal of a shard
        whose state is known to be wrong (`_refusal`), noted: no checkpoint
        is to hold it."""
        refused = self._refusal() if to_save else None
        if refused is not None:
            refused.add_note("this server shard's state was not saved")
            return Failure(refused)
        state: ServerState = await self.on_device(self._server_state)
        return state

    async def _save(self, path: Any) -> Any:
        """`SaveCheckpoint`: this shard's state, as a checkpoint at `path`
        (refused, nothing written, where `_state_for` refuses it)."""
        state = await self._state_for(to_save=True)
        if isinstance(state, Failure):
            return state
        ckpt = checkpoint_of([state], self.model_config)
        result = await self.on_device(guarded, save_checkpoint, path, ckpt)
        return Failure(result.error) if isinstance(result, Rejected) else None

    async def _load(self, path: Any) -> Any:
        """`LoadCheckpoint`: a checkpoint's state, read as a shard of its own
        (its range the whole vector; the trainer loads its shards through
        `SetServerState`), through `_set_state`. It is checked against the
        dtype the shard holds (its model config may name none, or another),
        so that a checkpoint of wider weights is refused, not rounded
        (`check_model_matches`)."""
        ckpt = await self.on_device(guarded, merge_shards, path)
        if isinstance(ckpt, Rejected):
            return Failure(ckpt.error)
        try:
            ranges = [(0, self.n)]
            (state,) = server_states(
                ckpt, ranges, self.kind, self.model_config, "ServerShard", self.dtype
            )
        except CheckpointError as exc:
            return Failure(exc)
        result = await self._set_state(state)
        if isinstance(result, Failure):
            return Failure(CheckpointError(f"checkpoint does not fit: {result.exception}"))
        return None


def _held_for_good(worker: int | None, round_id: int) -> Callable[[], Exception]:
    """What a shard that cannot undo `worker`'s push of `round_id` refuses with."""

    def error() -> Exception:
        return RoundFailedError(
            f"this server shard holds worker {worker}'s push of round {round_id}, which "
            "failed on another shard, and cannot undo it (another push was applied after "
            "it): the shards hold a model mixed from two versions, so it refuses to serve "
            "until a checkpoint is loaded (LoadCheckpoint, or SetServerState)"
        )

    return error
