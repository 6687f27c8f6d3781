"""`DataParallelTrainer`: one model replicated on N devices, each replica an
actor; a step splits the batch, every replica computes its shard's gradient
at once, the gradients are all-reduced and every replica applies the same
optimizer step (see docs/data_parallel.md).

A step is atomic, in two phases:

1. every replica computes the gradient of its shard's loss *sum*
   (`ComputeGradients`), touching no weights; the sums are all-reduced
   (host collective or ring) and, with a `process_collective`, across
   processes; the total is divided once by the total normaliser, so the
   result is the full-batch mean gradient for any split; it is checked and
   clipped. If anything fails here, no weights changed anywhere.
2. every replica snapshots and applies (`ApplyGradients`); if one fails, the
   others roll back (`Rollback`; also one whose ask timed out, which may
   still apply) and the failed one is re-synced.

A replica that failed is restarted by its supervisor (this trainer, for the
replicas it spawned) and re-synced from a healthy one (`GetState` ->
`SetState`); the asker gets the replica's own exception, and the next step
works. A replica this trainer resumes (`OutOfMemory`) during a ring
all-reduce may have lost a told chunk: the ring is aborted at once and the
step fails with that exception. Bad input is answered with `Failure(exc)`
and changes nothing.

`LoadCheckpoint` is all or none: replica 0's state is copied to the host
first; if any replica fails to load (a `Failure`, a crash, an ask timeout),
every replica is given that copy back (a restarted one too), the trainer
keeps its step count, and the asker gets the replica's own exception.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from atomr.accel import Device
from atomr.actor import (
    Actor,
    ActorRef,
    ActorStoppedError,
    AskTimeoutError,
    Directive,
    Failure,
    OneForOneStrategy,
    Props,
    SupervisorStrategy,
)
from atomr.train._fanout import ask_all, ask_all_settled, failed_indices
from atomr.train._recovery import ResumedCrashWatch, resync, worker_decider
from atomr.train.comm.collective import Collective, HostCollective
from atomr.train.comm.ring import RingAllReduce
from atomr.train.core._cpu import cpu_backend
from atomr.train.core.checkpoint import (
    Checkpoint,
    CheckpointError,
    check_model_matches,
    load_checkpoint,
    save_checkpoint,
)
from atomr.train.core.clip import clip_grad_norm
from atomr.train.core.config import TrainerConfig
from atomr.train.core.device_guard import REQUEST_ERRORS
from atomr.train.core.messages import (
    Evaluate,
    GetReplicaWeights,
    GetWeights,
    LoadCheckpoint,
    SaveCheckpoint,
    SetReplicas,
    Step,
)
from atomr.train.core.mlp import Mlp
from atomr.train.core.partition import bounds
from atomr.train.core.stats import EvalResult, StepStats
from atomr.train.core.step_checks import check_gradient, check_loss, check_normaliser
from atomr.train.core.validation import validate_batch
from atomr.train.data_parallel.replica import (
    ApplyGradients,
    ComputeGradients,
    EvaluateShard,
    GetState,
    GradientResult,
    ReplicaActor,
    ReplicaState,
    Rollback,
    SetState,
    ShardEval,
)
from atomr.train.data_parallel.speed_balancer import SpeedBalancer

__all__ = ["DataParallelConfig", "DataParallelTrainer", "ReplicaDivergenceError", "replica_decider"]

logger = logging.getLogger(__name__)

_COLLECTIVES = ("host", "ring")


class ReplicaDivergenceError(RuntimeError):
    """The periodic check found replicas whose weights differ."""


@dataclass(frozen=True)
class DataParallelConfig:
    """How a `DataParallelTrainer` distributes its work.

    Attributes:
        collective: "host" (the replicas' gradients are summed into one host
            buffer by `HostCollective`) or "ring" (the replicas run a ring
            all-reduce among themselves with actor messages).
        balance: split batches by measured replica speed (`SpeedBalancer`);
            off: as evenly as possible.
        speed_hint: initial relative speed of each replica (with `balance`).
        recalibrate_every: steps between re-computations of the split.
        min_share: smallest fraction of a batch given to any replica.
        check_every: every K applied steps, check that all replicas hold
            bit-identical weights (a `ReplicaDivergenceError` if not);
            None: never.
        timeout: seconds to wait for any replica's reply.

    Raises:
        ValueError: unknown collective, or a value out of range.
    """

    collective: str = "host"
    balance: bool = False
    speed_hint: tuple[float, ...] | None = None
    recalibrate_every: int = 10
    min_share: float = 0.05
    check_every: int | None = None
    timeout: float = 60.0

    def __post_init__(self) -> None:
        if self.collective not in _COLLECTIVES:
            raise ValueError(f"collective must be one of {_COLLECTIVES}, got {self.collective!r}")
        if self.check_every is not None and (
            not isinstance(self.check_every, int) or self.check_every < 1
        ):
            raise ValueError(f"check_every must be an int >= 1 or None, got {self.check_every!r}")
        if not self.timeout > 0:
            raise ValueError(f"timeout must be > 0, got {self.timeout}")
        if self.speed_hint is not None:
            object.__setattr__(self, "speed_hint", tuple(float(s) for s in self.speed_hint))


replica_decider = worker_decider
"""How the trainer supervises the replicas it spawned (`recovery.worker_decider`):
STOP for `Unrecoverable` (the trainer goes on with the others), RESUME for
`OutOfMemory` (the replica is re-synced anyway), RESTART for anything else."""


def _finalize(grads: np.ndarray, scale: float, clip: float | None) -> float:
    """On the host thread: `grads *= scale` and its norm (one fused pass), then clip."""
    norm = math.sqrt(cpu_backend().sum_scale_norm(grads, [grads], scale))
    _clip(grads, clip, norm)
    return norm


def _clip(grads: np.ndarray, clip: float | None, norm: float) -> None:
    """Clip `grads` (whose norm is `norm`) to `clip`, if set and the norm is finite."""
    if clip is not None and math.isfinite(norm):
        clip_grad_norm(cpu_backend(), grads, clip, norm)


class DataParallelTrainer(Actor):
    """Data-parallel training over replica actors (module docstring).

    Answers `Step -> StepStats` (sample-weighted over the replicas),
    `GetWeights -> ndarray` (replica 0's), `GetReplicaWeights -> list`,
    `Evaluate -> EvalResult`, `SaveCheckpoint`, `LoadCheckpoint` (the
    checkpoint format of every trainer) and `SetReplicas`.

    Args:
        config: optimizer, loss, clipping and `accumulation_steps` (K: the
            replicas accumulate K micro-batches locally and synchronise once).
        replicas: the replicas in rank order: `ActorRef`s of actors answering
            `ReplicaProtocol` (supervised by whoever spawned them), or
            `Props` that this trainer spawns as its children and supervises
            (`replica_decider`). May be empty until `SetReplicas`.
        parallel: collective, balancing and checks (`DataParallelConfig`).
        process_collective: when set, the locally reduced gradient sum, loss
            sum, normaliser and sample count are all-reduced (summed) across
            processes through it before clipping and applying, and the
            initial weights are broadcast from its root; every process must
            step in lockstep.

    Raises:
        TypeError: wrong argument types.
    """

    def __init__(
        self,
        config: TrainerConfig,
        replicas: Sequence[ActorRef | Props] = (),
        parallel: DataParallelConfig | None = None,
        process_collective: Collective | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(config, TrainerConfig):
            raise TypeError(f"config must be a TrainerConfig, got {type(config).__name__}")
        parallel = DataParallelConfig() if parallel is None else parallel
        if not isinstance(parallel, DataParallelConfig):
            raise TypeError(f"parallel must be a DataParallelConfig, got {type(parallel).__name__}")
        if process_collective is not None and not isinstance(process_collective, Collective):
            raise TypeError("process_collective must be a Collective")
        for k, r in enumerate(replicas):
            if not isinstance(r, ActorRef | Props):
                raise TypeError(
                    f"replicas[{k}] must be an ActorRef or Props, got {type(r).__name__}"
                )
        self.config = config
        self.parallel = parallel
        self.process_collective = process_collective
        self._initial = list(replicas)
        self.replicas: list[ActorRef] = []
        self.collective: Collective = (
            HostCollective() if parallel.collective == "host" else RingAllReduce(parallel.timeout)
        )
        self.balancer: SpeedBalancer | None = None
        self.steps = 0
        self._synced = False
        self._model: dict[str, Any] = {}
        self._n_params = 0
        self._lost: BaseException | None = None
        self._tokens = itertools.count(1)
        self._executor: ThreadPoolExecutor | None = None
        # a replica resumed during a ring all-reduce may have lost a told RingChunk
        self._resumed = ResumedCrashWatch()
        self._reset_window()

    # -- construction -------------------------------------------------------

    @classmethod
    def props(
        cls,
        config: TrainerConfig,
        replicas: Sequence[ActorRef | Props] = (),
        *,
        parallel: DataParallelConfig | None = None,
        process_collective: Collective | None = None,
    ) -> Props:
        """The `Props` of a trainer over the given replicas (see the class).

        Returns:
            The Props.
        """
        return Props(cls, config, list(replicas), parallel, process_collective)

    @classmethod
    async def spawn(
        cls,
        system: Any,
        model: Mlp,
        devices: Sequence[Device | str],
        config: TrainerConfig,
        *,
        parallel: DataParallelConfig | None = None,
        process_collective: Collective | None = None,
        name: str | None = None,
    ) -> ActorRef:
        """Spawn a trainer with one `ReplicaActor` of `model` per device and
        wait until the replicas hold replica 0's weights.

        Args:
            system: the `ActorSystem` (or a `Context`) to spawn in.
            model: the model (copied onto each device).
            devices: one device per replica (e.g. `cpu_devices(2)`), all CPU
                devices or all CUDA devices (several replicas may share one).
                CPU and CUDA kernels round differently, so replicas on both
                kinds would drift apart instead of staying bit-identical.
            config: as for the class.
            parallel, process_collective: as for the class.
            name: the trainer's actor name, or None.

        Returns:
            The trainer's `ActorRef`.

        Raises:
            TypeError: `model` is not an `Mlp` or `config` not a `TrainerConfig`.
            ValueError: no devices, a bad device name, or CPU and CUDA devices mixed.
        """
        if not isinstance(model, Mlp) or not isinstance(config, TrainerConfig):
            raise TypeError("DataParallelTrainer.spawn needs an Mlp and a TrainerConfig")
        devs = [Device.parse(d) for d in devices]
        if not devs:
            raise ValueError("DataParallelTrainer.spawn needs at least one device")
        if len({d.kind for d in devs}) > 1:
            raise ValueError(
                f"DataParallelTrainer.spawn: devices {[str(d) for d in devs]} mix CPU and "
                "CUDA; their kernels round differently, so the replicas would not stay "
                "bit-identical: put every replica on the same kind of device"
            )
        timeout = (parallel or DataParallelConfig()).timeout
        replica_props = [ReplicaActor.props(model, d, config, ring_timeout=timeout) for d in devs]
        props = cls.props(
            config, replica_props, parallel=parallel, process_collective=process_collective
        )
        ref: ActorRef = system.spawn(props, name=name)
        await ref.ask(GetWeights(), timeout=max(timeout, 60.0))
        return ref

    def supervisor_strategy(self) -> SupervisorStrategy:
        """`replica_decider` for the replicas this trainer spawned."""
        return OneForOneStrategy(decider=self._decide)

    def _decide(self, error: BaseException) -> Directive:
        """`replica_decider`; a replica resumed during a ring all-reduce also ends it."""
        return self._resumed.note(replica_decider(error), error)

    def pre_start(self) -> None:
        """Spawn the replicas given as `Props`."""
        refs = []
        for k, r in enumerate(self._initial):
            refs.append(self.context.spawn(r, name=f"replica-{k}") if isinstance(r, Props) else r)
        self._set_replicas(refs)

    def post_stop(self) -> None:
        """Stop the host worker thread."""
        if isinstance(self.collective, HostCollective):
            self.collective.close()
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False)

    def _set_replicas(self, refs: list[ActorRef]) -> None:
        self.replicas = refs
        p = self.parallel
        n = max(1, len(refs))
        hint = p.speed_hint if p.speed_hint is not None and len(p.speed_hint) == n else None
        if p.speed_hint is not None and hint is None:
            logger.warning(
                "speed_hint has %d entries for %d replicas; ignored", len(p.speed_hint), n
            )
        self.balancer = SpeedBalancer(
            n,
            enabled=p.balance,
            speed_hint=hint,
            recalibrate_every=p.recalibrate_every,
            min_share=min(p.min_share, 1.0 / n),
        )
        self._synced = False
        self._reset_window()

    def _reset_window(self) -> None:
        self._micro = 0
        self._accum_loss = 0.0
        self._accum_norm = 0.0

    async def _host(self, fn: Any, *args: Any) -> Any:
        """Run host-side math or file I/O off the event loop."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="atomr-dp-host")
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    # -- messages -----------------------------------------------------------

    async def receive(self, message: Any) -> Any:
        """Dispatch a trainer message (see the class docstring)."""
        try:
            if isinstance(message, SetReplicas):
                return await self._on_set_replicas(message)
            if not self.replicas:
                return Failure(RuntimeError("no replicas: send SetReplicas first"))
            if self._lost is not None and not isinstance(message, LoadCheckpoint):
                return Failure(
                    RuntimeError(
                        f"every replica failed ({self._lost!r}); their state is lost: "
                        "send LoadCheckpoint to go on"
                    )
                )
            await self._sync()
            if isinstance(message, Step):
                return await self._step(message)
            if isinstance(message, GetWeights):
                return await self.replicas[0].ask(GetWeights(), timeout=self.parallel.timeout)
            if isinstance(message, GetReplicaWeights):
                return await ask_all(
                    self.replicas, GetWeights(), self.parallel.timeout, per_worker=False
                )
            if isinstance(message, Evaluate):
                return await self._evaluate(message)
            if isinstance(message, SaveCheckpoint):
                return await self._save(message)
            if isinstance(message, LoadCheckpoint):
                return await self._load(message)
            return Failure(
                TypeError(f"DataParallelTrainer does not handle {type(message).__name__}")
            )
        except Exception as exc:  # every failure is answered; replicas are repaired below
            return Failure(exc)

    async def _on_set_replicas(self, message: SetReplicas) -> None:
        refs = list(message.replicas)
        for k, r in enumerate(refs):
            if not isinstance(r, ActorRef):
                raise TypeError(f"replicas[{k}] must be an ActorRef, got {type(r).__name__}")
        self._set_replicas(refs)
        self._lost = None
        if refs:
            await self._sync()

    async def _sync(self) -> None:
        """Once: broadcast replica 0's state (across processes: the root's)."""
        if self._synced:
            return
        t = self.parallel.timeout
        state: ReplicaState = await self.replicas[0].ask(GetState(), timeout=t)
        targets = self.replicas[1:]
        if self.process_collective is not None:
            weights = np.ascontiguousarray(state.weights)
            await self.process_collective.broadcast([weights], 0)
            state = ReplicaState(state.model, weights, {}, 0)
            targets = self.replicas
        if targets:
            await ask_all(targets, SetState(state), t, per_worker=False)
        self._model = dict(state.model)
        self._n_params = int(np.asarray(state.weights).size)
        self._synced = True

    def _validate(self, message: Step | Evaluate) -> tuple[np.ndarray, np.ndarray]:
        sizes = self._model["sizes"]
        return validate_batch(
            message.features,
            message.labels,
            sizes[0],
            self.config.loss,
            out_width=sizes[-1],
            dtype=np.dtype(self._model.get("dtype", "float32")),
        )

    def _shards(self, x: np.ndarray, y: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        assert self.balancer is not None
        return [(x[lo:hi], y[lo:hi]) for lo, hi in bounds(self.balancer.split(x.shape[0]))]

    # -- the step -----------------------------------------------------------

    async def _step(self, message: Step) -> StepStats | Failure:
        t0 = time.perf_counter_ns()
        x, y = self._validate(message)
        k = self.config.accumulation_steps
        last = self._micro + 1 >= k
        host = not isinstance(self.collective, RingAllReduce)
        shards = self._shards(x, y)
        msgs = [
            ComputeGradients(xs, ys, accumulate=self._micro > 0, return_gradients=last and host)
            for xs, ys in shards
        ]
        results = await ask_all_settled(self.replicas, msgs, self.parallel.timeout)
        if failed_indices(results):
            self._reset_window()
            return await self._repair(results)
        grads: list[GradientResult] = results
        assert self.balancer is not None
        self.balancer.record([r.samples for r in grads], [r.micros for r in grads])
        loss_sum = self._accum_loss + sum(r.loss_sum for r in grads)
        norm = self._accum_norm + sum(r.normaliser for r in grads)
        if not last:
            self._micro += 1
            self._accum_loss, self._accum_norm = loss_sum, norm
            micro = sum(r.loss_sum for r in grads) / max(sum(r.normaliser for r in grads), 1e-300)
            micros = (time.perf_counter_ns() - t0) // 1000
            return StepStats(float(micro), 0.0, int(micros), int(x.shape[0]), applied=False)
        self._reset_window()
        return await self._reduce_and_apply(grads, loss_sum, norm, x.shape[0], t0)

    async def _reduce_and_apply(
        self, grads: list[GradientResult], loss_sum: float, norm: float, batch: int, t0: int
    ) -> StepStats | Failure:
        pc = self.process_collective
        clip = self.config.gradient_clip
        reduced: np.ndarray | None = None
        grad_norm: float | None = None  # set once `reduced` is scaled and clipped
        if isinstance(self.collective, RingAllReduce):
            # a replica resumed on a told RingChunk lost it: end the ring at once
            interrupt = self._resumed.begin()
            try:
                reduced = await self.collective.all_reduce(
                    self.replicas,
                    result_from=0 if pc is not None else None,
                    interrupt=interrupt,
                )
            except Exception as exc:
                # re-sync every member that failed on its own (a resync of a
                # healthy one is harmless: it copies identical state); after an
                # interrupt the list is empty: the resumed replica kept its weights
                failed = list(getattr(exc, "failed_workers", [getattr(exc, "worker_index", 0)]))
                await self._resync(failed, failed)
                exc.add_note("the ring all-reduce failed; the step was not applied")
                return Failure(exc)
            finally:
                self._resumed.end()
        elif pc is None and isinstance(self.collective, HostCollective):
            # one process: sum, scale by 1 / normaliser and measure in one pass
            check_loss(loss_sum)
            check_normaliser(norm)
            buffers = [g.gradients for g in grads]
            reduced, sumsq = await self.collective.all_reduce_scaled(buffers, 1.0 / norm)
            grad_norm = math.sqrt(sumsq)
            if clip is not None and math.isfinite(grad_norm):
                await self._host(_clip, reduced, clip, grad_norm)
        else:
            reduced = await self.collective.all_reduce([g.gradients for g in grads])
        if pc is not None:
            scalars = np.array([loss_sum, norm, float(batch)], dtype=np.float64)
            scalars = await pc.all_reduce([scalars])
            loss_sum, norm = float(scalars[0]), float(scalars[1])
            reduced = await pc.all_reduce([reduced])
        check_loss(loss_sum)
        check_normaliser(norm)
        token = next(self._tokens)
        if reduced is not None:
            if grad_norm is None:
                grad_norm = await self._host(_finalize, reduced, 1.0 / norm, clip)
            check_gradient(grad_norm)
            apply = ApplyGradients(reduced, token=token)
        else:
            apply = ApplyGradients(None, scale=1.0 / norm, clip=clip, token=token)
        results = await ask_all_settled(
            self.replicas, apply, self.parallel.timeout, per_worker=False
        )
        if failed_indices(results):
            # a replica whose ask timed out may still apply: its Rollback waits behind it
            undo = [
                r
                for r, res in zip(self.replicas, results, strict=True)
                if not isinstance(res, BaseException) or isinstance(res, AskTimeoutError)
            ]
            await ask_all_settled(undo, Rollback(token), self.parallel.timeout, per_worker=False)
            return await self._repair(results)
        if grad_norm is None:  # the replicas finalised their own buffers
            grad_norm = float(results[0])
        self.steps += 1
        check = self.parallel.check_every
        if check is not None and self.steps % check == 0:
            await self._check_identical()
        micros = (time.perf_counter_ns() - t0) // 1000
        return StepStats(loss_sum / norm, float(grad_norm), int(micros), int(batch))

    async def _repair(
        self, results: list[Any], outcome: str = "the step was not applied"
    ) -> Failure:
        """After a failed phase: re-sync the replicas that crashed, answer the
        error (its note names the replica and says `outcome`)."""
        failed = failed_indices(results)
        crashed = [i for i in failed if not isinstance(results[i], REQUEST_ERRORS)]
        await self._resync(crashed, failed)
        error = results[failed[0]]
        error.worker_index = failed[0]
        error.add_note(f"raised by replica {failed[0]}; {outcome}")
        return Failure(error)

    async def _resync(self, crashed: list[int], failed: list[int]) -> None:
        """Copy a healthy replica's state into each crashed (restarted) one."""
        if not crashed:
            return
        healthy = [i for i in range(len(self.replicas)) if i not in failed]
        t = self.parallel.timeout
        if not healthy:
            self._lost = RuntimeError(f"replicas {crashed} failed and none is healthy")
            logger.error("DataParallelTrainer: no healthy replica left to re-sync from")
            return
        state = await self.replicas[healthy[0]].ask(GetState(), timeout=t)
        outcome = await resync(self.replicas, crashed, lambda _: (SetState(state),), t)
        if outcome.gone:
            self._drop(outcome.gone)
        if outcome.bad:
            self._lost = RuntimeError(f"replicas {outcome.bad} could not be re-synced")

    def _drop(self, gone: list[int]) -> None:
        """Go on without the replicas that stopped (the others stay in sync)."""
        logger.warning("DataParallelTrainer: replicas %s stopped; going on without them", gone)
        self._set_replicas([r for i, r in enumerate(self.replicas) if i not in gone])
        self._synced = True

    async def _check_identical(self) -> None:
        weights = await ask_all(
            self.replicas, GetWeights(), self.parallel.timeout, per_worker=False
        )
        differ = [i for i, w in enumerate(weights) if not np.array_equal(w, weights[0])]
        if differ:
            logger.error("DataParallelTrainer: replicas %s differ from replica 0", differ)
            raise ReplicaDivergenceError(
                f"after step {self.steps}, replicas {differ} hold weights different from "
                "replica 0's (max abs difference "
                f"{max(float(np.max(np.abs(weights[i] - weights[0]))) for i in differ):.3g})"
            )

    # -- evaluation and checkpoints -------------------------------------------

    async def _evaluate(self, message: Evaluate) -> EvalResult:
        x, y = self._validate(message)
        msgs = [EvaluateShard(xs, ys) for xs, ys in self._shards(x, y)]
        parts: list[ShardEval] = await ask_all(self.replicas, msgs, self.parallel.timeout)
        norm = sum(p.normaliser for p in parts)
        check_normaliser(norm)
        accuracy = float("nan")
        if self.config.loss.is_classification:
            accuracy = sum(p.correct for p in parts) / x.shape[0]
        return EvalResult(sum(p.loss_sum for p in parts) / norm, accuracy, int(x.shape[0]))

    async def _save(self, message: SaveCheckpoint) -> None:
        if self._micro > 0:
            raise CheckpointError(
                f"{self._micro} micro-steps into an accumulation window: the accumulated "
                "gradients live on the replicas; save after the window's last step"
            )
        state: ReplicaState = await self.replicas[0].ask(GetState(), timeout=self.parallel.timeout)
        ckpt = Checkpoint(
            model=state.model,
            weights=np.asarray(state.weights),
            step=self.steps,
            optimizer=state.optimizer,
            extra={"trainer": "DataParallelTrainer", "micro": 0},
        )
        await self._host(save_checkpoint, message.path, ckpt)

    async def _load(self, message: LoadCheckpoint) -> Failure | None:
        """Check the checkpoint, then load it into every replica, all or none.

        Replica 0's state is copied to the host first (the one copy a load
        costs; skipped while the replicas' state is lost). If a replica fails
        to load, every replica is given that copy back (`_unload`) and the
        trainer keeps its step count; a pending accumulation window is
        dropped either way (`SetState` clears the replicas' gradients).

        Returns:
            None, or a `Failure` when replica 0 failed to give its state
            (then nothing was loaded).

        Raises:
            CheckpointError: the file or its contents do not fit (nothing changed).
            Exception: the first failing replica's own exception (`_unload`).
        """
        ckpt: Checkpoint = await self._host(load_checkpoint, message.path)
        check_model_matches(ckpt, self._model, self._n_params)
        if int(ckpt.extra.get("micro", 0)) > 0:
            raise CheckpointError(
                "checkpoint was saved in the middle of an accumulation window; "
                "DataParallelTrainer cannot resume it"
            )
        probe = self.config.optimizer.create(self._n_params)
        try:
            probe.load_state_dict(ckpt.optimizer)
        except (KeyError, ValueError, TypeError) as exc:
            raise CheckpointError(f"checkpoint optimizer state does not fit: {exc}") from exc
        t = self.parallel.timeout
        old: ReplicaState | None = None
        if self._lost is None:  # else there is no state worth keeping
            got = await ask_all_settled(self.replicas[:1], GetState(), t, per_worker=False)
            if failed_indices(got):
                self._reset_window()
                padded = got + [None] * (len(self.replicas) - 1)
                return await self._repair(padded, "the checkpoint was not loaded")
            old = got[0]
        state = ReplicaState(ckpt.model, ckpt.weights, ckpt.optimizer, int(ckpt.step))
        results = await ask_all_settled(self.replicas, SetState(state), t, per_worker=False)
        self._reset_window()
        if failed_indices(results):
            raise await self._unload(results, old)
        self.steps = int(ckpt.step)
        self._lost = None
        return None

    async def _unload(self, results: list[Any], old: ReplicaState | None) -> BaseException:
        """After a failed load: give every replica `old` (its state from before
        the load) back, the failed ones included (a restarted replica lost its
        state; a resumed one may have half loaded). A replica whose ask timed
        out may still load: its `SetState(old)` waits in its mailbox behind it.

        Returns:
            The first failing replica's exception, `worker_index` set and a
            note naming the replica and saying whether the replicas hold
            their old state again.
        """
        rank = failed_indices(results)[0]
        error: BaseException = results[rank]
        error.worker_index = rank  # type: ignore[attr-defined]
        if old is None:
            error.add_note(
                f"raised by replica {rank}; the checkpoint was not loaded and the replicas' "
                "state is still lost: send LoadCheckpoint to go on"
            )
            return error
        t = self.parallel.timeout
        restored = await ask_all_settled(self.replicas, SetState(old), t, per_worker=False)
        gone = [i for i, r in enumerate(restored) if isinstance(r, ActorStoppedError)]
        bad = [
            i
            for i, r in enumerate(restored)
            if isinstance(r, BaseException)
            and not isinstance(r, ActorStoppedError | AskTimeoutError)
        ]
        if bad:
            self._lost = RuntimeError(
                f"replicas {bad} could not be given back their state after a failed load"
            )
            error.add_note(
                f"raised by replica {rank}; the checkpoint was not loaded, and giving the "
                f"replicas back their state failed on replicas {bad}: send LoadCheckpoint"
            )
        else:
            error.add_note(
                f"raised by replica {rank}; the checkpoint was not loaded: every replica "
                "holds its state from before the load again"
            )
        if gone:
            self._drop(gone)
        return error
