"""`ParameterServerHandle`: a parameter-server deployment (servers + workers)
and the driver that trains it; built by `AsyncParameterServer.spawn`.

The driver splits every global batch into one part per worker
(`split_bounds`: uneven parts allowed) and runs one loop per worker, each
asking its worker to `TrainBatch` its parts in order. The loops do not wait
for each other: the servers' consistency model alone decides how far the
workers may drift apart. A worker that fails is restarted by its supervisor
(the actor system) and the driver sends the same batch again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from atomr.accel import Device
from atomr.actor import ActorRef, ActorStoppedError
from atomr.train._fanout import ask_all, raise_first_failure
from atomr.train.core.checkpoint import (
    Checkpoint,
    CheckpointError,
    check_model_matches,
    load_checkpoint,
    save_checkpoint,
)
from atomr.train.core.config import TrainerConfig
from atomr.train.core.device_guard import REQUEST_ERRORS
from atomr.train.core.messages import Evaluate, GetWeights
from atomr.train.core.mlp import Mlp
from atomr.train.core.optimizer import OptimizerKind
from atomr.train.core.partition import split_bounds
from atomr.train.core.stats import EvalResult, StepStats
from atomr.train.core.validation import validate_batch
from atomr.train.parameter_server.client import split_ranges
from atomr.train.parameter_server.consistency import Consistency
from atomr.train.parameter_server.messages import (
    GetShardState,
    ParameterServerStats,
    SetShardState,
    ShardState,
    Stats,
    TrainBatch,
)
from atomr.train.parameter_server.worker import PsWorker

__all__ = ["EpochRecord", "ParameterServerHandle", "build_parameter_server"]

# a bad request (`REQUEST_ERRORS`, a stale gradient among them) or a stopped worker:
# never retried
_NOT_RETRIED: tuple[type[Exception], ...] = (*REQUEST_ERRORS, ActorStoppedError)

_T = TypeVar("_T")


def _all_or_raise(results: list[_T | BaseException]) -> list[_T]:
    """The results of a settled gather, or its first failure raised."""
    raise_first_failure(results)
    return [r for r in results if not isinstance(r, BaseException)]


@dataclass(frozen=True, slots=True)
class EpochRecord:
    """One epoch of `ParameterServerHandle.run`.

    Attributes:
        epoch: 1-based epoch number.
        loss: mean training loss of the epoch's batches (sample-weighted).
        version: the first server's version at the end of the epoch.
        gradients_applied: gradients applied so far (first server).
        avg_staleness: mean staleness so far (first server).
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


class ParameterServerHandle:
    """Servers and workers of one parameter-server deployment.

    Attributes:
        servers: one server actor per range.
        workers: the worker actors (worker ids are their indices).
        ranges: `(start, stop)` of each server's range.
        model: the model being trained (its initial weights).
        consistency: the servers' consistency model.
        batch_size: global batch size of `run` (split among the workers).
    """

    def __init__(
        self,
        servers: list[ActorRef],
        workers: list[ActorRef],
        ranges: list[tuple[int, int]],
        model: Mlp,
        config: TrainerConfig,
        consistency: Consistency,
        batch_size: int,
        seed: int,
        max_retries: int,
    ) -> None:
        self.servers = servers
        self.workers = workers
        self.ranges = ranges
        self.model = model
        self.config = config
        self.consistency = consistency
        self.batch_size = batch_size
        self.seed = seed
        self.max_retries = max_retries
        self.retries = 0
        self._epochs_run = 0

    # -- driving --------------------------------------------------------------

    async def _ask_worker(self, index: int, message: Any) -> Any:
        """Ask worker `index`, sending again (up to `max_retries`) when it failed and
        was restarted; bad-request errors and a stopped worker are raised at once."""
        for attempt in range(self.max_retries + 1):
            try:
                return await self.workers[index].ask(message, timeout=600.0)
            except _NOT_RETRIED:
                raise
            except Exception:
                if attempt == self.max_retries:
                    raise
                self.retries += 1
        raise AssertionError("unreachable")

    def _parts(self, features: Any, labels: Any) -> list[tuple[Any, Any]]:
        """Validate the whole batch, then split it among the workers.

        Validating first keeps a step atomic: no worker pushes its part while
        another part is refused.
        """
        sizes = self.model.sizes
        x, y = validate_batch(
            features,
            labels,
            sizes[0],
            self.config.loss,
            out_width=sizes[-1],
            dtype=self.model.dtype,
        )
        return [(x[lo:hi], y[lo:hi]) for lo, hi in split_bounds(len(x), len(self.workers))]

    async def step(self, features: np.ndarray, labels: np.ndarray) -> list[StepStats]:
        """Train one global batch: each worker gets one part of it
        (`split_bounds`) and pushes one gradient. In synchronous mode this
        is exactly one optimizer step on the whole batch.

        Returns:
            One `StepStats` per worker.

        Raises:
            InvalidBatchError: the batch does not fit the model (checked
                whole, before any worker gets a part: nothing is applied).
            NonFiniteError: a part's loss or gradient is not finite; in
                synchronous mode nothing of the step is applied (the other
                workers' pushes fail too), otherwise the other parts'
                gradients were applied on arrival.
            Exception: a worker failed more than `max_retries` times.

        Every worker's answer is awaited before anything is raised (the first
        failure in worker order), so no part of a failed step is still running.
        """
        parts = self._parts(features, labels)
        results = await asyncio.gather(
            *(self._ask_worker(i, TrainBatch(x, y)) for i, (x, y) in enumerate(parts)),
            return_exceptions=True,
        )
        return _all_or_raise(results)

    async def _worker_loop(
        self, index: int, batches: list[tuple[Any, Any]], failed: asyncio.Event
    ) -> tuple[float, int]:
        """Train worker `index` on its parts in order; stop early once any
        loop failed (`failed`), so that no worker waits for a stopped one."""
        loss_sum, samples = 0.0, 0
        for x, y in batches:
            if failed.is_set():
                break
            try:
                st: StepStats = await self._ask_worker(index, TrainBatch(x, y))
            except BaseException:
                failed.set()
                raise
            loss_sum += st.loss * st.samples
            samples += st.samples
        return loss_sum, samples

    async def run(
        self,
        epochs: int,
        features: np.ndarray,
        labels: np.ndarray,
        *,
        test: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> list[EpochRecord]:
        """Train for `epochs` passes over the data and return the history.

        Each epoch shuffles the data (seeded: `seed + epoch`), cuts it into
        global batches of `batch_size`, splits each among the workers and lets
        every worker run through its parts at its own pace.

        Args:
            epochs: number of epochs (>= 1).
            features, labels: the training set.
            test: an optional `(features, labels)` test set evaluated after
                each epoch.

        Returns:
            One `EpochRecord` per epoch.

        Raises:
            ValueError: `epochs < 1` or features and labels differ in length.
            InvalidBatchError: the data do not fit the model.
            NonFiniteError: a batch part's loss or gradient is not finite. The
                other workers stop after their current batch and the error is
                raised once every worker has stopped (in synchronous mode the
                failed round is applied nowhere).
        """
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
            raise ValueError(f"epochs must be an int >= 1, got {epochs!r}")
        x_all, y_all = np.asarray(features), np.asarray(labels)
        if len(x_all) != len(y_all) or len(x_all) == 0:
            raise ValueError(f"{len(x_all)} feature rows for {len(y_all)} labels")
        history: list[EpochRecord] = []
        for _ in range(epochs):
            self._epochs_run += 1
            order = np.random.default_rng(self.seed + self._epochs_run).permutation(len(y_all))
            per_worker: list[list[tuple[Any, Any]]] = [[] for _ in self.workers]
            for start in range(0, len(order), self.batch_size):
                idx = order[start : start + self.batch_size]
                for i, part in enumerate(self._parts(x_all[idx], y_all[idx])):
                    per_worker[i].append(part)
            retries_before = self.retries
            t0 = time.perf_counter()
            failed = asyncio.Event()
            results = await asyncio.gather(
                *(self._worker_loop(i, b, failed) for i, b in enumerate(per_worker)),
                return_exceptions=True,
            )
            sums = _all_or_raise(results)
            seconds = time.perf_counter() - t0
            total = sum(n for _, n in sums)
            st = (await self.stats())[0]
            test_loss = test_acc = float("nan")
            if test is not None:
                ev = await self.evaluate(*test)
                test_loss, test_acc = ev.loss, ev.accuracy
            history.append(
                EpochRecord(
                    self._epochs_run,
                    sum(s for s, _ in sums) / max(total, 1),
                    st.version,
                    st.gradients_applied,
                    st.avg_staleness,
                    test_loss,
                    test_acc,
                    seconds,
                    self.retries - retries_before,
                )
            )
        return history

    # -- queries --------------------------------------------------------------

    async def stats(self) -> list[ParameterServerStats]:
        """Each server's `ParameterServerStats`."""
        return list(await ask_all(self.servers, Stats(), per_worker=False))

    async def get_weights(self) -> np.ndarray:
        """The full flat weight vector (`Mlp.params` layout), gathered from every range."""
        parts = await ask_all(self.servers, GetWeights(), per_worker=False)
        return np.concatenate([np.asarray(p, dtype=np.float32) for p in parts])

    async def evaluate(self, features: np.ndarray, labels: np.ndarray) -> EvalResult:
        """Loss and accuracy of the current weights (computed by worker 0 on its device).

        Raises:
            InvalidBatchError: the batch does not fit the model.
        """
        result: EvalResult = await self._ask_worker(0, Evaluate(features, labels))
        return result

    # -- checkpoints ----------------------------------------------------------

    async def save_checkpoint(self, path: Any) -> None:
        """Write weights and optimizer state of every range as one checkpoint
        (the format of `atomr.train.core.checkpoint`, loadable by any trainer of
        the same model).

        Raises:
            CheckpointError, OSError: the file could not be written.
        """
        states: list[ShardState] = await ask_all(self.servers, GetShardState(), per_worker=False)
        optimizer: dict[str, Any] = dict(states[0].optimizer)
        for key, value in states[0].optimizer.items():
            if isinstance(value, np.ndarray):
                optimizer[key] = np.concatenate([np.asarray(s.optimizer[key]) for s in states])
        ckpt = Checkpoint(
            model=self.model.config(),
            weights=np.concatenate([s.weights for s in states]),
            step=states[0].version,
            optimizer=optimizer,
            extra={"trainer": "AsyncParameterServer", "shards": len(states)},
        )
        await asyncio.to_thread(save_checkpoint, path, ckpt)

    async def load_checkpoint(self, path: Any) -> None:
        """Restore weights and optimizer state into every range.

        Raises:
            CheckpointError: unreadable, for another model, or optimizer state
                that does not fit (checked before any server is changed).
        """
        ckpt = await asyncio.to_thread(load_checkpoint, path)
        check_model_matches(ckpt, self.model.config(), self.model.n_params)
        if int(ckpt.extra.get("micro", 0)) != 0:
            raise CheckpointError("checkpoint is in the middle of a gradient accumulation")
        try:
            kind = OptimizerKind.from_config(ckpt.optimizer["kind"])
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"checkpoint optimizer state is malformed: {exc!r}") from exc
        if kind.name != self.config.optimizer.name:
            raise CheckpointError(
                f"checkpoint optimizer is {kind.name!r}, these servers run "
                f"{self.config.optimizer.name!r}"
            )
        n = self.model.n_params
        for key, value in ckpt.optimizer.items():
            if isinstance(value, np.ndarray) and value.shape != (n,):
                raise CheckpointError(f"optimizer buffer {key!r} has shape {value.shape}")
        msgs = []
        for lo, hi in self.ranges:
            opt = {
                k: (v[lo:hi] if isinstance(v, np.ndarray) else v) for k, v in ckpt.optimizer.items()
            }
            msgs.append(SetShardState(ShardState(ckpt.weights[lo:hi], opt, int(ckpt.step))))
        await ask_all(self.servers, msgs)

    async def stop(self) -> None:
        """Stop every worker and server."""
        for ref in [*self.workers, *self.servers]:
            ref.stop()


async def build_parameter_server(
    system: Any,
    model: Mlp,
    devices: Sequence[Device | str] | Device | str,
    workers: int | None = None,
    config: TrainerConfig | None = None,
    *,
    consistency: Consistency | None = None,
    max_staleness: int | None = None,
    shards: int = 1,
    server_devices: Sequence[Device | str] | None = None,
    batch_size: int = 64,
    seed: int = 0,
    max_retries: int = 3,
    worker_class: type[PsWorker] = PsWorker,
) -> ParameterServerHandle:
    """Spawn `shards` servers and `workers` workers for `model` in `system`.

    Args:
        system: the `ActorSystem` (or a `Context`) to spawn in; it supervises
            the actors (a failed worker is restarted).
        model: the `Mlp` to train (its weights are the initial weights).
        devices: the workers' devices, used round-robin.
        workers: number of workers (default: one per device).
        config: optimizer, loss and clipping (`accumulation_steps` must be 1;
            clipping needs `shards == 1`).
        consistency: asynchronous (default), bounded(s) or synchronous.
        max_staleness: reject pushes staler than this (None: no bound).
        shards: number of server actors the weight vector is split across.
        server_devices: the servers' devices (default: `devices`, round-robin).
        batch_size: global batch size of `run`.
        seed: seed of `run`'s shuffles.
        max_retries: batches re-sent after a worker failure, per batch.
        worker_class: the worker actor class (a `PsWorker` subclass).

    Returns:
        The `ParameterServerHandle`.

    Raises:
        TypeError: `model` is not an Mlp or `config` not a TrainerConfig.
        ValueError: no devices, bad counts, `accumulation_steps != 1`, or
            clipping with several shards.
    """
    if not isinstance(model, Mlp):
        raise TypeError(f"model must be an Mlp, got {type(model).__name__}")
    if not isinstance(config, TrainerConfig):
        raise TypeError(f"config must be a TrainerConfig, got {type(config).__name__}")
    if config.accumulation_steps != 1:
        raise ValueError("the parameter server does not accumulate gradients (use batch_size)")
    devs = [devices] if isinstance(devices, (str, Device)) else list(devices)
    if not devs:
        raise ValueError("need at least one device")
    devs = [Device.parse(d) for d in devs]
    n_workers = len(devs) if workers is None else workers
    if isinstance(n_workers, bool) or not isinstance(n_workers, int) or n_workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    consistency = consistency or Consistency.asynchronous()
    if shards > 1 and config.gradient_clip is not None:
        raise ValueError("gradient clipping needs the global norm: use shards=1")
    ranges = split_ranges(model.n_params, shards)
    sdevs = [Device.parse(d) for d in (server_devices or devs)]
    weights = model.get_params()
    servers: list[ActorRef] = []
    from atomr.train.parameter_server.server import AsyncParameterServer

    for k, (lo, hi) in enumerate(ranges):
        props = AsyncParameterServer.props(
            weights[lo:hi],
            config.optimizer,
            max_staleness,
            consistency=consistency,
            workers=n_workers,
            device=sdevs[k % len(sdevs)],
            gradient_clip=config.gradient_clip,
            model_config=model.config() if shards == 1 else None,
        )
        servers.append(system.spawn(props))
    refs = [
        system.spawn(
            worker_class.props(
                i,
                model,
                devs[i % len(devs)],
                config,
                servers,
                ranges,
                consistency.is_synchronous,
            )
        )
        for i in range(n_workers)
    ]
    await ask_all(servers, Stats(), per_worker=False)
    return ParameterServerHandle(
        servers, refs, ranges, model, config, consistency, batch_size, seed, max_retries
    )
