"""`PipelineParallelTrainer`: consecutive layers in stage actors on different
devices; each batch is cut into micro-batches that flow through the stages,
forward and backward, on a GPipe or 1F1B schedule (docs/pipeline_parallel.md).

A step:

1. validate the batch, cut it into micro-batches, compute the whole batch's
   loss normaliser from the labels (so micro-batch gradients add up to the
   whole-batch mean exactly, uneven micro-batches and weighted CE included);
2. `RunMicroBatches` to every stage with its ops from the schedule plan; the
   stages pass activations forward and gradients backward to each other and
   accumulate their parameter gradients without touching their weights;
3. if any stage fails, `AbortStep` to all, and the asker gets that stage's
   own exception: no stage changed anything;
4. else the global gradient norm over all stages (and the clipping factor),
   then `ApplyGradients` to every stage; if an apply fails, `RollbackStep`
   restores the stages that had applied;
5. a stage actor that raises (rather than answering `Failure`) is resumed
   with its state intact (its updates are atomic); only `ContextPoisoned`
   restarts it, unconnected and with its initial weights, and then the
   trainer answers every request with `WorkerStateLost` until a
   `LoadCheckpoint` succeeds (`recovery.StateLossWatch`; no host copy of the
   stages' state is kept).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from atomr.accel import Device
from atomr.actor import (
    Actor,
    ActorRef,
    Directive,
    Failure,
    OneForOneStrategy,
    Props,
    SupervisorStrategy,
)
from atomr.train._fanout import ask_all, ask_all_or_abort, ask_all_settled, failed_indices
from atomr.train._recovery import ResumedCrashWatch, StateLossWatch
from atomr.train.core.checkpoint import (
    Checkpoint,
    CheckpointError,
    check_model_matches,
    load_checkpoint,
    save_checkpoint,
)
from atomr.train.core.config import check_update_rule
from atomr.train.core.loss import LossKind
from atomr.train.core.messages import Evaluate, GetWeights, LoadCheckpoint, SaveCheckpoint, Step
from atomr.train.core.mlp import Mlp
from atomr.train.core.optimizer import OptimizerKind
from atomr.train.core.partition import bounds
from atomr.train.core.stats import EvalResult, StepStats
from atomr.train.core.step_checks import check_gradient, check_loss, check_normaliser
from atomr.train.core.validation import validate_batch
from atomr.train.pipeline.schedule import OpKind, Schedule, split_micro_batches
from atomr.train.pipeline.stage import (
    AbortStep,
    ApplyGradients,
    ConnectStage,
    GetStageGradients,
    GetStageState,
    GetStageWeights,
    RollbackStep,
    RunMicroBatches,
    SetStageState,
    StageActor,
    StageInfo,
    StageReport,
    StageState,
    balanced_split,
)
from atomr.train.pipeline.timeline import BusyInterval, GetTimeline, Timeline

__all__ = ["GetGradients", "PipelineConfig", "PipelineParallelTrainer"]


@dataclass(frozen=True)
class PipelineConfig:
    """What the pipeline trainer needs besides its stages.

    Attributes:
        micro_batch_size: samples per micro-batch (>= 1); a batch of `n` is
            cut into `ceil(n / micro_batch_size)` micro-batches, the last one
            taking the remainder.
        gradient_clip: clip the gradient to this global L2 norm (over all
            stages) before the optimizer step, or None.
        optimizer: the update rule (keyword).
        loss: the loss (keyword).
        ask_timeout: seconds the trainer waits for a stage's answer (keyword;
            None: forever).

    Raises:
        TypeError: `optimizer` or `loss` of the wrong type.
        ValueError: `micro_batch_size < 1`, a clip that is not positive and
            finite, or a timeout that is not positive.
    """

    micro_batch_size: int
    gradient_clip: float | None = None
    optimizer: OptimizerKind = field(kw_only=True)
    loss: LossKind = field(kw_only=True)
    ask_timeout: float | None = field(default=120.0, kw_only=True)

    def __post_init__(self) -> None:
        mbs = self.micro_batch_size
        if isinstance(mbs, bool) or not isinstance(mbs, int) or mbs < 1:
            raise ValueError(f"micro_batch_size must be an int >= 1, got {mbs!r}")
        check_update_rule(self.optimizer, self.loss, self.gradient_clip)
        if self.ask_timeout is not None and not float(self.ask_timeout) > 0:
            raise ValueError(f"ask_timeout must be > 0 or None, got {self.ask_timeout}")


@dataclass(frozen=True, slots=True)
class GetGradients:
    """Ask a `PipelineParallelTrainer` for the full flat gradient of its last
    training step (the whole-batch mean, clipped if clipping applied), in the
    `Mlp.params` layout; answered with an ndarray."""


def _normaliser(loss: LossKind, labels: np.ndarray, out_width: int) -> float:
    """The whole batch's loss normaliser, computed from the labels alone."""
    batch = labels.shape[0]
    if loss.name == "mse":
        return float(batch * out_width)
    if loss.class_weights is None:
        return float(batch)
    return float(np.asarray(loss.class_weights, dtype=np.float64)[labels].sum())


class PipelineParallelTrainer(Actor):
    """Trains a model cut into pipeline stages, one stage actor per device.

    Answers `Step -> StepStats`, `GetWeights -> ndarray` (the stages'
    parameters concatenated: the `Mlp.params` layout), `GetGradients ->
    ndarray`, `Evaluate -> EvalResult`, `GetTimeline -> Timeline | None`,
    `SaveCheckpoint` / `LoadCheckpoint -> None` (the checkpoint format of
    every trainer). Bad input, non-finite losses or gradients, bad
    checkpoints and failed stages are answered with a `Failure`; the step
    is then not applied on any stage.

    Args:
        config: micro-batch size, clipping, optimizer, loss.
        stages: the stages in pipeline order: `ActorRef`s of actors speaking
            `PipelineStageProtocol`, or `Props` the trainer spawns as its
            children.
        schedule: `Schedule.GPIPE` or `Schedule.ONE_F_ONE_B` (or its name).

    Raises:
        TypeError: bad config or stage entries.
        ValueError: no stages, unknown schedule.
    """

    def __init__(
        self,
        config: PipelineConfig,
        stages: Sequence[ActorRef | Props],
        schedule: Schedule | str = Schedule.ONE_F_ONE_B,
    ) -> None:
        super().__init__()
        if not isinstance(config, PipelineConfig):
            raise TypeError(f"config must be a PipelineConfig, got {type(config).__name__}")
        stages = list(stages)
        if not stages:
            raise ValueError("a pipeline needs at least one stage")
        for s in stages:
            if not isinstance(s, ActorRef | Props):
                raise TypeError(f"a stage must be an ActorRef or Props, got {type(s).__name__}")
        self.config = config
        self.schedule = Schedule.parse(schedule)
        self._given = stages
        self.stages: list[ActorRef] = []
        self.infos: list[StageInfo] = []
        self.offsets: list[int] = [0]
        self.steps = 0
        self._step_id = 0
        self._timeline: Timeline | None = None
        self._watch = StateLossWatch("stage")
        # a stage resumed during a pass may leave its RunMicroBatches unanswered
        self._resumed = ResumedCrashWatch()

    @classmethod
    def props(
        cls,
        config: PipelineConfig,
        stages: Sequence[ActorRef | Props],
        schedule: Schedule | str = Schedule.ONE_F_ONE_B,
    ) -> Props:
        """The `Props` of a pipeline trainer (see the class docstring)."""
        return Props(cls, config, list(stages), schedule)

    @classmethod
    async def spawn(
        cls,
        system: Any,
        model: Mlp,
        devices: Sequence[Device | str],
        config: PipelineConfig,
        schedule: Schedule | str = Schedule.ONE_F_ONE_B,
        *,
        split: Sequence[int] | None = None,
        stage_class: type[StageActor] = StageActor,
        name: str | None = None,
    ) -> ActorRef:
        """Cut `model` into one stage per device, spawn the trainer and its
        stages, and wait until every stage holds its layers.

        Args:
            system: the `ActorSystem` (or a `Context`) to spawn in.
            model: the model (copied; the given object is not modified).
            devices: one device per stage, in pipeline order.
            config: as for the class.
            schedule: `Schedule.GPIPE`, `Schedule.ONE_F_ONE_B` or its name.
            split: layers per stage (e.g. `[2, 1]`), or None for the split
                balancing the stages' parameter counts (`balanced_split`).
            stage_class: the stage actor class (a `StageActor` subclass).
            name: the trainer's name, or None.

        Returns:
            The trainer's `ActorRef`.

        Raises:
            TypeError: `model` is not an `Mlp`, or a bad `stage_class`.
            ValueError: no devices, more devices than layers, a split that
                does not cover the layers, unknown schedule or device.
        """
        if not isinstance(model, Mlp):
            raise TypeError(f"model must be an Mlp, got {type(model).__name__}")
        if not (isinstance(stage_class, type) and issubclass(stage_class, StageActor)):
            raise TypeError(f"stage_class must be a StageActor subclass, got {stage_class!r}")
        devs = [Device.parse(d) for d in devices]
        if not devs:
            raise ValueError("need at least one device")
        schedule = Schedule.parse(schedule)
        sizes = model.sizes
        if split is None:
            layer_params = [a * b + b for a, b in zip(sizes[:-1], sizes[1:], strict=True)]
            counts = balanced_split(layer_params, len(devs))
        else:
            counts = [int(c) for c in split]
            if (
                len(counts) != len(devs)
                or any(c < 1 for c in counts)
                or sum(counts) != model.n_layers
            ):
                raise ValueError(
                    f"split {list(split)} must give each of the {len(devs)} stages >= 1 layer "
                    f"and cover the model's {model.n_layers} layers"
                )
        props = []
        start = 0
        for count, dev in zip(counts, devs, strict=True):
            props.append(stage_class.props(model.slice_layers(start, start + count), dev))
            start += count
        ref: ActorRef = system.spawn(cls.props(config, props, schedule), name=name)
        await ref.ask(GetWeights(), timeout=config.ask_timeout)
        return ref

    # -- life cycle ---------------------------------------------------------

    def pre_start(self) -> None:
        """Spawn the stages given as `Props` (children of the trainer)."""
        self.stages = [
            self.context.spawn(s, name=f"stage-{i}") if isinstance(s, Props) else s
            for i, s in enumerate(self._given)
        ]

    def supervisor_strategy(self) -> SupervisorStrategy:
        """Resume a stage that raised (its state is intact), stop it on
        `Unrecoverable`, restart it on `ContextPoisoned` and remember that its
        state is lost (`recovery.StateLossWatch`)."""
        return OneForOneStrategy(decider=self._decide)

    def _decide(self, error: BaseException) -> Directive:
        """`StateLossWatch.decide`; a stage resumed during a pass also ends the pass."""
        return self._resumed.note(self._watch.decide(error), error)

    def _connect_message(self, i: int) -> ConnectStage:
        p = len(self.stages)
        return ConnectStage(
            i,
            p,
            self.stages[i - 1] if i > 0 else None,
            self.stages[i + 1] if i + 1 < p else None,
            self.config.optimizer,
        )

    async def _connect(self) -> None:
        p = len(self.stages)
        msgs = [self._connect_message(i) for i in range(p)]
        infos = await ask_all(self.stages, msgs, self.config.ask_timeout)
        for i, info in enumerate(infos):
            if not isinstance(info, StageInfo):
                raise TypeError(f"stage {i} answered ConnectStage with {type(info).__name__}")
        for i in range(p - 1):
            if infos[i].sizes[-1] != infos[i + 1].sizes[0]:
                raise ValueError(
                    f"stage {i} outputs width {infos[i].sizes[-1]}, stage {i + 1} takes "
                    f"{infos[i + 1].sizes[0]}"
                )
        self.offsets = [0]
        for info in infos:
            self.offsets.append(self.offsets[-1] + info.n_params)
        self.infos = list(infos)

    @property
    def model_config(self) -> dict[str, Any]:
        """The whole model's config (`Mlp.config()` shape) from the stages."""
        sizes = list(self.infos[0].sizes)
        for info in self.infos[1:]:
            sizes += list(info.sizes[1:])
        return {
            "sizes": sizes,
            "activation": self.infos[0].activation,
            "dtype": self.infos[0].dtype,
            "activate_last": False,
            "seed": None,
        }

    # -- messages -----------------------------------------------------------

    async def receive(self, message: Any) -> Any:
        """Dispatch a trainer message (see the class docstring); while a
        stage's state is lost, only `LoadCheckpoint` is served
        (`StateLossWatch.serve`)."""
        return await self._watch.serve(message, self._dispatch, self._reload)

    async def _dispatch(self, message: Any) -> Any:
        if not self.infos:
            await self._connect()
        if isinstance(message, Step):
            return await self._step(message)
        if isinstance(message, Evaluate):
            return await self._evaluate(message)
        if isinstance(message, GetWeights):
            parts = await ask_all(
                self.stages, GetStageWeights(), self.config.ask_timeout, per_worker=False
            )
            return np.concatenate(parts)
        if isinstance(message, GetGradients):
            parts = await ask_all(
                self.stages, GetStageGradients(), self.config.ask_timeout, per_worker=False
            )
            return np.concatenate(parts)
        if isinstance(message, GetTimeline):
            return self._timeline
        if isinstance(message, SaveCheckpoint):
            return await self._save(message.path)
        if isinstance(message, LoadCheckpoint):
            return await self._load(message.path)
        return Failure(
            TypeError(f"PipelineParallelTrainer does not handle {type(message).__name__}")
        )

    def _batch(self, features: Any, labels: Any) -> tuple[np.ndarray, np.ndarray]:
        first, last = self.infos[0], self.infos[-1]
        return validate_batch(
            features,
            labels,
            first.sizes[0],
            self.config.loss,
            out_width=last.sizes[-1],
            dtype=np.dtype(first.dtype),
        )

    def _micro(
        self, x: np.ndarray, y: np.ndarray
    ) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
        cuts = bounds(split_micro_batches(x.shape[0], self.config.micro_batch_size))
        return tuple(x[a:b] for a, b in cuts), tuple(y[a:b] for a, b in cuts)

    async def _run(
        self, xs: tuple[np.ndarray, ...], ys: tuple[np.ndarray, ...], norm: float, train: bool
    ) -> list[StageReport]:
        """Run one pipelined pass over the micro-batches; abort everywhere on a failure."""
        p, m = len(self.stages), len(xs)
        self._step_id += 1
        sid = self._step_id
        if train:
            plan = self.schedule.plan(p, m)
        else:
            fwd = self.schedule.plan(p, m)
            plan = tuple(tuple(op for op in ops if op.kind is OpKind.FORWARD) for ops in fwd)
        msgs = [
            RunMicroBatches(
                sid,
                plan[s],
                train,
                self.config.loss,
                norm,
                xs if s == 0 else None,
                ys if s == p - 1 else None,
            )
            for s in range(p)
        ]

        async def abort() -> None:
            await ask_all_settled(
                self.stages, AbortStep(sid), self.config.ask_timeout, per_worker=False
            )

        # A stage that crashes on a told message (Activations, Gradients) is
        # resumed with its RunMicroBatches unanswered: end the pass on its crash.
        crashed = self._resumed.begin()
        run = asyncio.ensure_future(
            ask_all_or_abort(self.stages, msgs, abort, self.config.ask_timeout)
        )
        try:
            await asyncio.wait((run, crashed), return_when=asyncio.FIRST_COMPLETED)
            if run.done():
                return run.result()
            error = crashed.result()
            await abort()
            await asyncio.gather(run, return_exceptions=True)
            error.add_note(f"raised by a stage actor during step {sid}; aborted on every stage")
            raise error
        finally:
            self._resumed.end()
            if not run.done():
                run.cancel()

    async def _step(self, msg: Step) -> StepStats:
        t0 = time.perf_counter()
        x, y = self._batch(msg.features, msg.labels)
        norm = _normaliser(self.config.loss, y, self.infos[-1].sizes[-1])
        check_normaliser(norm)
        xs, ys = self._micro(x, y)
        reports = await self._run(xs, ys, norm, train=True)
        loss_sum = reports[-1].loss_sum
        check_loss(loss_sum)
        grad_norm = math.sqrt(sum(r.grad_sq_norm for r in reports))
        check_gradient(grad_norm)
        coef = 1.0
        clip = self.config.gradient_clip
        if clip is not None:
            coef = min(1.0, clip / (grad_norm + 1e-6))
        sid = self._step_id
        results = await ask_all_settled(
            self.stages, ApplyGradients(sid, coef), self.config.ask_timeout, per_worker=False
        )
        failed = failed_indices(results)
        if failed:
            await ask_all_settled(
                self.stages, RollbackStep(sid), self.config.ask_timeout, per_worker=False
            )
            error = results[failed[0]]
            error.worker_index = failed[0]
            error.add_note(f"ApplyGradients failed on stage {failed[0]}; every stage rolled back")
            raise error
        self.steps += 1
        elapsed = time.perf_counter() - t0
        self._timeline = self._make_timeline(reports, t0, elapsed, len(xs))
        return StepStats(loss_sum / norm, grad_norm, int(elapsed * 1e6), int(x.shape[0]))

    def _make_timeline(
        self, reports: list[StageReport], t0: float, elapsed: float, m: int
    ) -> Timeline:
        intervals = sorted(
            (
                BusyInterval(s, iv.kind, iv.micro, iv.start - t0, iv.end - t0)
                for s, r in enumerate(reports)
                for iv in r.intervals
            ),
            key=lambda iv: (iv.start, iv.stage),
        )
        return Timeline(
            self.schedule.value,
            len(self.stages),
            m,
            tuple(intervals),
            elapsed,
            tuple(r.peak_held for r in reports),
        )

    async def _evaluate(self, msg: Evaluate) -> EvalResult:
        x, y = self._batch(msg.features, msg.labels)
        norm = _normaliser(self.config.loss, y, self.infos[-1].sizes[-1])
        check_normaliser(norm)
        xs, ys = self._micro(x, y)
        reports = await self._run(xs, ys, norm, train=False)
        accuracy = float("nan")
        if self.config.loss.is_classification:
            accuracy = reports[-1].correct / x.shape[0]
        return EvalResult(reports[-1].loss_sum / norm, accuracy, int(x.shape[0]))

    # -- checkpoints --------------------------------------------------------

    async def _save(self, path: Any) -> None:
        states: list[StageState] = await ask_all(
            self.stages, GetStageState(), self.config.ask_timeout, per_worker=False
        )
        optimizer: dict[str, Any] = {
            "kind": states[0].optimizer["kind"],
            "step": states[0].optimizer["step"],
        }
        buffers = {k for st in states for k, v in st.optimizer.items() if isinstance(v, np.ndarray)}
        for name in sorted(buffers):
            parts = [st.optimizer.get(name) for st in states]
            arrays = [a for a in parts if isinstance(a, np.ndarray)]
            if len(arrays) == len(parts):
                optimizer[name] = np.concatenate(arrays)
        ckpt = Checkpoint(
            model=self.model_config,
            weights=np.concatenate([st.weights for st in states]),
            step=self.steps,
            optimizer=optimizer,
            extra={"trainer": "PipelineParallelTrainer"},
        )
        await asyncio.to_thread(save_checkpoint, path, ckpt)

    async def _load(self, path: Any) -> None:
        ckpt = await asyncio.to_thread(load_checkpoint, path)
        n = self.offsets[-1]
        check_model_matches(ckpt, self.model_config, n)
        if int(ckpt.extra.get("micro", 0)) > 0:
            raise CheckpointError("checkpoint is in the middle of a gradient accumulation")
        try:  # validate the optimizer state on the whole vector before touching any stage
            self.config.optimizer.create(n).load_state_dict(ckpt.optimizer)
        except (KeyError, ValueError, TypeError) as exc:
            raise CheckpointError(f"checkpoint optimizer state does not fit: {exc}") from exc
        new_states = []
        for lo, hi in zip(self.offsets[:-1], self.offsets[1:], strict=True):
            opt = {
                k: (v[lo:hi] if isinstance(v, np.ndarray) and v.shape == (n,) else v)
                for k, v in ckpt.optimizer.items()
            }
            new_states.append(StageState(np.asarray(ckpt.weights[lo:hi]), opt))
        old = await ask_all(self.stages, GetStageState(), self.config.ask_timeout, per_worker=False)
        results = await ask_all_settled(
            self.stages, [SetStageState(s) for s in new_states], self.config.ask_timeout
        )
        if failed_indices(results):
            await ask_all_settled(
                self.stages, [SetStageState(s) for s in old], self.config.ask_timeout
            )
            raise results[failed_indices(results)[0]]
        self.steps = int(ckpt.step)

    async def _reload(self, message: LoadCheckpoint) -> None:
        """`LoadCheckpoint` after a stage lost its state: re-connect every stage
        (the restarted one came back unconnected), then give each its part of
        the checkpoint. The trainer serves again only if this succeeds and no
        stage was restarted meanwhile.

        Raises:
            Exception: as `LoadCheckpoint`; the trainer keeps refusing (also
                when a stage restarted again meanwhile: `StateLossWatch.serve`
                answers that with `WorkerStateLost`).
        """
        generation = self._watch.generation
        self.infos = []
        await self._connect()
        await self._load(message.path)
        self._watch.clear(generation)
