"""`AsyncParameterServer`: the parameter-server trainer, an actor that spawns
and supervises its server shards and workers (see docs/parameter_server.md).

The weight vector is cut into K contiguous ranges, one `ServerShard` each
(holding the range's weights and optimizer state); N `ParameterServerWorker`s
pull every range, compute a gradient of their part of a batch on their own
device and push it back. The trainer splits every global batch among the
workers (`split_bounds`: uneven parts allowed) and combines their answers.
The shards' consistency model alone decides how far the workers may drift
apart: `Step` waits for every worker's part, `TrainEpochs` lets each worker
run through its parts at its own pace.

The shards and workers are the trainer's children: stopping the trainer
stops them. A child that raises is resumed, or restarted after
`ContextPoisoned` (`state_keeping_decider`): a worker keeps no state
between batches, so the part it failed on is simply sent again
(`ParameterServerOptions.max_retries`), with its round id, so that the
shards do not apply a part twice whose push had landed; a shard's updates
are atomic, so a resumed shard's state is valid, and a synchronous round
that failed is rolled back on every shard (`WorkerPool`), as is an
asynchronous push whose range failed on one shard (`ShardedClient.push`).
A restarted shard, though, comes back with its initial weights and
optimizer: it refuses to serve, so the request under way fails at once,
and the trainer answers every request with `WorkerStateLost` until a
`LoadCheckpoint` succeeds (`recovery.StateLossWatch`; no host copy of the
state is kept).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from atomr.accel import Device
from atomr.actor import (
    Actor,
    ActorRef,
    Props,
    SupervisorStrategy,
)
from atomr.train._contract import check_name, check_system, refuse_message, spawn_ready
from atomr.train._recovery import StateLossWatch
from atomr.train.comm._fanout import ask_all, set_learning_rate
from atomr.train.core._step_checks import check_step_limit
from atomr.train.core.config import TrainerConfig
from atomr.train.core.data import epoch_order
from atomr.train.core.messages import (
    Evaluate,
    GetTrainingState,
    GetWeights,
    LoadCheckpoint,
    SaveCheckpoint,
    SetLearningRate,
    Step,
)
from atomr.train.core.model.sequential import Sequential
from atomr.train.core.models import batch_spec
from atomr.train.core.sharded_index import merge_shards
from atomr.train.core.stats import StepStats, TrainingState
from atomr.train.core.validation import detached
from atomr.train.parameter_server._checkpoint import (
    load_servers,
    save_servers,
    server_states,
)
from atomr.train.parameter_server._layout import Layout
from atomr.train.parameter_server._pool import WorkerPool, combine, split_among
from atomr.train.parameter_server._supervision import ShardLossStrategy
from atomr.train.parameter_server.messages import (
    EpochReport,
    GetServerStats,
    ParameterServerStats,
    Stats,
    TrainEpochs,
)
from atomr.train.parameter_server.options import ParameterServerOptions

__all__ = ["AsyncParameterServer"]


class AsyncParameterServer(Actor):
    """The parameter-server trainer (module docstring).

    Answers `Step -> StepStats`, `Evaluate -> EvalResult` (worker 0, with
    freshly pulled weights; in synchronous mode `RoundFailedError` when the
    shards are at different versions), `GetWeights -> ndarray` (every range, gathered),
    `SaveCheckpoint`, `LoadCheckpoint` (the checkpoint format of every
    trainer; all or none across the shards), `GetServerStats -> list[ParameterServerStats]` and
    `TrainEpochs -> list[EpochReport]`. Every failure is answered with a
    `Failure`; the trainer itself is never restarted for one. After a server
    shard was restarted (it lost its range's weights and optimizer state),
    every request but `LoadCheckpoint` is answered with `WorkerStateLost`
    (kind "server shard"), and so is the request it was restarted during.

    `Step`'s `StepStats` combine the workers' parts (`_pool.combine`):
    `loss` is the whole batch's mean loss; `grad_norm` is the parts'
    gradient norms weighted by their loss normalisers, an upper bound of the
    norm of the gradient a synchronous round applies (equal with one worker);
    `step_micros` is the slowest part's. In synchronous mode a `Step` is one
    optimizer step on the whole batch, equal to the single-device
    `Trainer`'s, kept by every shard or by none (a round that failed on one
    shard is rolled back on the others: `RoundFailedError`); in the
    asynchronous models every part is applied on arrival, on every shard or
    on none (a part whose range failed on one shard is rolled back on the
    others, which held it: `RoundFailedError`; the other parts are kept).

    Args:
        layout: the checked deployment (`Layout.plan`; use `props` or `spawn`).
    """

    def __init__(self, layout: Layout) -> None:
        super().__init__()
        self.layout = layout
        self._spec = batch_spec(layout.model.config())
        self.config = layout.config
        self.model_config = layout.model.config()
        self.servers: list[ActorRef] = []
        self.pool = WorkerPool([], layout.options.max_retries, layout.config.worker_timeout)
        self.epochs_run = 0
        self._watch = StateLossWatch("server shard")

    # -- construction ---------------------------------------------------------

    @classmethod
    def props(
        cls,
        model: Sequential,
        devices: Sequence[Device | str],
        config: TrainerConfig,
        options: ParameterServerOptions | None = None,
    ) -> Props:
        """The `Props` of a trainer; every argument is checked here.

        Args:
            model: the `Sequential` to train (its weights are the initial weights).
            devices: the workers' devices, used round-robin (and the server
                shards', unless `options.server_devices` says otherwise).
            config: optimizer, loss, clipping (one shard only) and
                `worker_timeout`; `accumulation_steps` must be 1.
            options: the parameter server's options (None: the defaults).

        Returns:
            The Props.

        Raises:
            TypeError, ValueError: see `Layout.plan`.
        """
        return Props(cls, Layout.plan(model, devices, config, options))

    @classmethod
    async def spawn(
        cls,
        system: Any,
        model: Sequential,
        devices: Sequence[Device | str],
        config: TrainerConfig,
        options: ParameterServerOptions | None = None,
        name: str | None = None,
    ) -> ActorRef:
        """Spawn a trainer with its server shards and workers, and wait until
        every shard holds its weights.

        Args:
            system: the `ActorSystem` (or a `Context`) to spawn in.
            model, devices, config, options: as for `props`.
            name: the trainer's actor name, or None.

        Returns:
            The trainer's `ActorRef`.

        Raises:
            TypeError: `system` is not an `ActorSystem` or `Context`, `name`
                is not a str or None, or see `Layout.plan` (each message names
                the argument); raised before anything is spawned.
            ValueError: see `Layout.plan`.
        """
        check_system(system)
        check_name(name)
        props = cls.props(model, devices, config, options)
        return await spawn_ready(system, props, name, GetServerStats(), config.worker_timeout)

    def supervisor_strategy(self) -> SupervisorStrategy:
        """`state_keeping_decider` for the shards and workers; a server shard's
        restart is recorded as a loss of its state (`StateLossWatch`)."""
        return ShardLossStrategy(self._watch, lambda: self.servers)

    def pre_start(self) -> None:
        """Spawn the server shards, then the workers."""
        layout = self.layout
        self.servers = [
            self.context.spawn(props, name=f"server-{k}")
            for k, props in enumerate(layout.server_props())
        ]
        workers = [
            self.context.spawn(props, name=f"worker-{i}")
            for i, props in enumerate(layout.worker_props(self.servers))
        ]
        options = layout.options
        self.pool = WorkerPool(
            workers,
            options.max_retries,
            layout.config.worker_timeout,
            options.consistency,
            self.servers,
        )

    # -- messages -------------------------------------------------------------

    async def receive(self, message: Any) -> Any:
        """Answer a trainer message (see the class docstring); while a server
        shard's state is lost, only `LoadCheckpoint` is served
        (`StateLossWatch.serve`)."""
        return await self._watch.serve(message, self._dispatch, self._reload)

    async def _dispatch(self, message: Any) -> Any:
        """Dispatch a trainer message (see the class docstring).

        Raises:
            Exception: whatever the request failed with (answered with a `Failure`).
        """
        if isinstance(message, GetTrainingState):
            return TrainingState(await self._applied(), self.config.max_steps)
        if isinstance(message, Step):
            return await self._step(message)
        if isinstance(message, Evaluate):
            return await self.pool.ask(0, message)
        if isinstance(message, GetWeights):
            return await self._weights()
        if isinstance(message, SaveCheckpoint):
            return await self._save(message.path)
        if isinstance(message, LoadCheckpoint):
            return await self._load(message.path)
        if isinstance(message, GetServerStats):
            return await self._stats()
        if isinstance(message, SetLearningRate):
            timeout = self.config.worker_timeout
            return await set_learning_rate(
                self.config.optimizer, self._spec.dtype, self.servers, message, timeout
            )
        if isinstance(message, TrainEpochs):
            return await self._train_epochs(message)
        return refuse_message("AsyncParameterServer", message)

    def _validate(self, features: Any, labels: Any) -> tuple[np.ndarray, np.ndarray]:
        """The whole batch checked before any worker gets a part of it, so that
        no part is pushed while another is refused.

        Raises:
            InvalidBatchError: it does not fit the model.
        """
        return self._spec.validate(features, labels, self.config.loss)

    async def _step(self, msg: Step) -> StepStats:
        """The batch split among the workers, each part pushed as one update
        (one round under synchronous consistency); under a step limit, among
        no more workers than updates remain, so the limit is met exactly.
        Under a `worker_timeout` the workers get a copy: a worker past it may
        read its part after the `Step` answered, and the sender refilled it.

        Raises:
            StepLimitError: the server is at `max_steps`.
            InvalidBatchError: the batch does not fit the model, or (synchronous)
                every target of it has class weight 0 (nothing is applied).
        """
        workers, limit = len(self.pool), self.config.max_steps
        synchronous = self.pool.consistency.is_synchronous
        if limit is not None:
            applied = await self._applied()
            check_step_limit(applied, limit)
            if not synchronous:
                workers = min(workers, limit - applied)
        x, y = self._validate(msg.features, msg.labels)
        if self.config.worker_timeout is not None:  # copied unless validation made them anew
            x, y = detached(x, msg.features), detached(y, msg.labels)
        return combine(await self.pool.train(split_among(x, y, workers)), synchronous)

    async def _applied(self) -> int:
        """Updates the server applied (its version: one per pushed gradient)."""
        return int((await self._stats())[0].version)

    async def _stats(self) -> list[ParameterServerStats]:
        timeout = self.config.worker_timeout
        return list(await ask_all(self.servers, Stats(), timeout, per_worker=False))

    async def _weights(self) -> np.ndarray:
        timeout = self.config.worker_timeout
        parts = await ask_all(self.servers, GetWeights(), timeout, per_worker=False)
        return np.concatenate([np.asarray(p) for p in parts])

    async def _save(self, path: Any) -> None:
        """Every range's weights and optimizer state as one checkpoint (`save_servers`)."""
        timeout = self.config.worker_timeout
        await save_servers(self.servers, path, self.model_config, len(self.pool), timeout)

    async def _load(self, path: Any) -> None:
        """A checkpoint into every range, all or none (`load_servers`).

        Raises:
            CheckpointError: a bad checkpoint (`server_states`: no shard changed).
            Exception: as `load_servers`.
        """
        ckpt = await asyncio.to_thread(merge_shards, path)
        ranges, optimizer = self.layout.ranges, self.config.optimizer
        states = server_states(
            ckpt, ranges, optimizer, self.model_config, "AsyncParameterServer", self._spec.dtype
        )
        self.pool.weights_changed()  # also when the load fails and is undone
        keep_old = self._watch.lost() is None  # else nothing to go back to
        await load_servers(self.servers, states, keep_old, self.config.worker_timeout)

    async def _reload(self, message: LoadCheckpoint) -> None:
        """`LoadCheckpoint` after a server shard lost its state: every range
        is given its part of the checkpoint (the restarted shard built its
        initial weights and optimizer on the way). The trainer serves again
        only if this succeeds and no shard was restarted meanwhile.

        Raises:
            Exception: as `LoadCheckpoint`; the trainer keeps refusing (also
                when a shard restarted again meanwhile: `StateLossWatch.serve`
                answers that with `WorkerStateLost`).
        """
        generation = self._watch.generation
        await self._load(message.path)
        self._watch.clear(generation)

    # -- epochs ---------------------------------------------------------------

    async def _train_epochs(self, msg: TrainEpochs) -> list[EpochReport]:
        """Every epoch's parts, each worker at its own pace.

        Raises:
            ValueError: under `max_steps`, which the workers' own pace cannot
                stop at exactly (`Step` and `fit` do).
            InvalidBatchError: the set does not fit the model.
        """
        if self.config.max_steps is not None:
            raise ValueError(
                f"TrainEpochs does not stop at max_steps ({self.config.max_steps}): "
                "train with Step or fit, which do"
            )
        x, y = self._validate(msg.features, msg.labels)
        return [await self._epoch(x, y, msg) for _ in range(msg.epochs)]

    def _epoch_parts(
        self, x: np.ndarray, y: np.ndarray, msg: TrainEpochs
    ) -> list[list[tuple[np.ndarray, np.ndarray]]]:
        """This epoch's global batches (shuffled), each split among the workers:
        one list of parts per worker."""
        order = epoch_order(len(y), msg.seed, self.epochs_run)
        per_worker: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(len(self.pool))]
        for start in range(0, len(order), msg.batch_size):
            idx = order[start : start + msg.batch_size]
            for own, part in zip(
                per_worker, split_among(x[idx], y[idx], len(self.pool)), strict=True
            ):
                own.append(part)
        return per_worker

    async def _epoch(self, x: np.ndarray, y: np.ndarray, msg: TrainEpochs) -> EpochReport:
        self.epochs_run += 1
        parts = self._epoch_parts(x, y, msg)
        retries_before = self.pool.retries
        t0 = time.perf_counter()
        trained = combine(
            await self.pool.train_in_order(parts), self.pool.consistency.is_synchronous
        )
        seconds = time.perf_counter() - t0
        first = (await self._stats())[0]
        test_loss = test_accuracy = float("nan")
        if msg.test is not None:
            result = await self.pool.ask(0, Evaluate(*msg.test))
            test_loss, test_accuracy = result.loss, result.accuracy
        return EpochReport(
            self.epochs_run,
            trained.loss,
            first.version,
            first.gradients_applied,
            first.avg_staleness,
            test_loss,
            test_accuracy,
            seconds,
            self.pool.retries - retries_before,
        )
