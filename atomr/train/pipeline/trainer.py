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
   then `ApplyStageGradients` to every stage; if an apply fails, `RollbackStep`
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
from typing import Any

import numpy as np

from atomr.accel import Device
from atomr.actor import (
    Actor,
    ActorRef,
    Directive,
    OneForOneStrategy,
    Props,
    SupervisorStrategy,
)
from atomr.train._contract import refuse_message, spawn_ready
from atomr.train._recovery import ResumedCrashWatch, StateLossWatch
from atomr.train.comm._fanout import set_learning_rate
from atomr.train.core._step_checks import (
    check_gradient,
    check_loss,
    check_normaliser,
    check_step_limit,
    evaluation,
)
from atomr.train.core.accumulation import check_resumable_window
from atomr.train.core.checkpoint import (
    Checkpoint,
    check_model_matches,
    check_optimizer_state,
    save_checkpoint,
)
from atomr.train.core.clip import clip_coefficient
from atomr.train.core.config import TrainerConfig
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
from atomr.train.core.sharded_index import merge_shards
from atomr.train.core.stats import EvalResult, StepStats, TrainingState
from atomr.train.pipeline._checkpoint import split_checkpoint
from atomr.train.pipeline._construction import check_props, spawn_stages
from atomr.train.pipeline.group import StageGroup
from atomr.train.pipeline.messages import (
    GetGradients,
    GetStageGradients,
    GetStageWeights,
    GetTimeline,
    RunMicroBatches,
)
from atomr.train.pipeline.options import PipelineOptions
from atomr.train.pipeline.schedule import OpKind
from atomr.train.pipeline.timeline import Timeline

__all__ = ["PipelineParallelTrainer"]


class PipelineParallelTrainer(Actor):
    """Trains a model cut into pipeline stages, one stage actor per device.

    Answers `Step -> StepStats`, `GetWeights -> ndarray` (the stages'
    parameters concatenated: the model's flat layout), `GetGradients ->
    ndarray`, `Evaluate -> EvalResult`, `GetTimeline -> Timeline | None`,
    `SaveCheckpoint` / `LoadCheckpoint -> None` (the checkpoint format of
    every trainer). Bad input, non-finite losses or gradients, bad
    checkpoints and failed stages are answered with a `Failure`; the step
    is then not applied on any stage.

    Build it with `spawn` (the model cut into one built-in stage per device)
    or `props` (stages you built).

    Args:
        config: optimizer, loss, clipping and the stages' reply deadline
            (`worker_timeout`); `accumulation_steps` must be 1.
        stages: the stages in pipeline order: `ActorRef`s of actors speaking
            `PipelineStageProtocol`, or `Props` the trainer spawns as its
            children ("stage-0", ...).
        options: `PipelineOptions` (micro-batch size, schedule), or None for
            the defaults.

    Raises:
        TypeError: `config`, `stages` or `options` of the wrong type (the
            stages neither all `ActorRef`s nor all `Props`).
        ValueError: no stages, one stage given twice, `accumulation_steps > 1`, or
            `options.split` / `options.stage_class` set (they are for `spawn`).
    """

    def __init__(
        self,
        config: TrainerConfig,
        stages: Sequence[ActorRef | Props],
        options: PipelineOptions | None = None,
    ) -> None:
        super().__init__()
        self.config, self._given, self.options = check_props(config, stages, options)
        self.stages: list[ActorRef] = []
        self._group: StageGroup | None = None
        self.steps = 0
        self._step_id = 0
        self._timeline: Timeline | None = None
        self._watch = StateLossWatch("stage")
        # a stage resumed during a pass may leave its RunMicroBatches unanswered
        self._resumed = ResumedCrashWatch()

    @classmethod
    def props(
        cls,
        config: TrainerConfig,
        stages: Sequence[ActorRef | Props],
        options: PipelineOptions | None = None,
    ) -> Props:
        """The `Props` of a trainer over stages you built (`ActorRef`s or `Props`).

        Args:
            config, stages, options: as for the class.

        Returns:
            The Props.

        Raises:
            TypeError, ValueError: as the class, checked here before anything
                is spawned.
        """
        check_props(config, stages, options)
        return Props(cls, config, list(stages), options)

    @classmethod
    async def spawn(
        cls,
        system: Any,
        model: Sequential,
        devices: Sequence[Device | str],
        config: TrainerConfig,
        options: PipelineOptions | None = None,
        name: str | None = None,
    ) -> ActorRef:
        """Cut `model` into one stage (`options.stage_class`) per device, spawn
        the trainer and its stages, and wait until every stage holds its layers.

        Args:
            system: the `ActorSystem` (or a `Context`) to spawn in.
            model: the model (copied; the given object is not modified).
            devices: one device per stage, in pipeline order.
            config: as for the class.
            options: `PipelineOptions` (micro-batch size, schedule, split,
                stage class), or None for the defaults.
            name: the trainer's name, or None.

        Returns:
            The trainer's `ActorRef`.

        Raises:
            TypeError: an argument of the wrong type (the message names it).
            ValueError: no devices, a bad device name, more devices than
                layers, an `options.split` that does not cover the layers, or
                `config.accumulation_steps > 1`; all raised before anything is
                spawned.
        """
        config, stages, built = spawn_stages(system, model, devices, config, options, name)
        props = cls.props(config, stages, built)
        return await spawn_ready(system, props, name, GetWeights(), config.worker_timeout)

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

    async def _ready(self) -> StageGroup:
        if self._group is None:
            self._group = await StageGroup.connect(self.stages, self.config)
        return self._group

    # -- messages -----------------------------------------------------------

    async def receive(self, message: Any) -> Any:
        """Dispatch a trainer message (see the class docstring); while a
        stage's state is lost, only `LoadCheckpoint` is served
        (`StateLossWatch.serve`)."""
        return await self._watch.serve(message, self._dispatch, self._reload)

    async def _dispatch(self, message: Any) -> Any:
        group = await self._ready()
        if isinstance(message, GetTrainingState):
            return TrainingState(self.steps, self.config.max_steps)
        if isinstance(message, Step):
            check_step_limit(self.steps, self.config.max_steps)
            return await self._step(group, message)
        if isinstance(message, Evaluate):
            return await self._evaluate(group, message)
        if isinstance(message, GetWeights):
            return np.concatenate(await group.all(GetStageWeights()))
        if isinstance(message, GetGradients):
            return np.concatenate(await group.all(GetStageGradients()))
        if isinstance(message, SetLearningRate):
            return await set_learning_rate(
                self.config.optimizer, group.spec.dtype, group.refs, message, group.timeout
            )
        if isinstance(message, GetTimeline):
            return self._timeline
        if isinstance(message, SaveCheckpoint):
            return await self._save(group, message.path)
        if isinstance(message, LoadCheckpoint):
            return await self._load(group, message.path)
        return refuse_message("PipelineParallelTrainer", message)

    def _batch(
        self, group: StageGroup, features: Any, labels: Any
    ) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...], float]:
        """Validate a batch; its micro-batches' features and labels, and the
        whole batch's loss normaliser.

        Raises:
            InvalidBatchError: bad input.
        """
        x, y = group.spec.validate(features, labels, self.config.loss)
        norm = self.config.loss.normaliser(y, group.spec.dtype)
        bounds = np.cumsum([0, *self.options.micro_batch_sizes(x.shape[0])])
        xs = tuple(x[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True))
        ys = tuple(y[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True))
        return xs, ys, norm

    def _next_pass(
        self, xs: tuple[np.ndarray, ...], ys: tuple[np.ndarray, ...], norm: float, train: bool
    ) -> list[RunMicroBatches]:
        """Begin a new pass (a new step id): every stage's `RunMicroBatches`
        (forwards only when not `train`)."""
        p, m = len(self.stages), len(xs)
        self._step_id += 1
        plan = self.options.schedule.plan(p, m)
        if not train:
            plan = tuple(tuple(op for op in ops if op.kind is OpKind.FORWARD) for ops in plan)
        loss = self.config.loss
        offsets = tuple(int(o) for o in np.cumsum([0, *(len(x) for x in xs[:-1])]))
        return [
            RunMicroBatches(
                self._step_id,
                plan[s],
                train,
                loss,
                norm,
                xs if s == 0 else None,
                ys if s == p - 1 else None,
                self.steps,
                offsets,
            )
            for s in range(p)
        ]

    async def _step(self, group: StageGroup, msg: Step) -> StepStats:
        t0 = time.perf_counter()
        xs, ys, norm = self._batch(group, msg.features, msg.labels)
        check_normaliser(norm)  # every target of weight 0 (an evaluation's loss is NaN)
        reports = await group.run(self._next_pass(xs, ys, norm, train=True), self._resumed)
        loss_sum = reports[-1].loss_sum
        check_loss(loss_sum)
        grad_norm = math.sqrt(sum(r.grad_sq_norm for r in reports))
        check_gradient(grad_norm)
        await group.apply(self._step_id, clip_coefficient(grad_norm, self.config.gradient_clip))
        self.steps += 1
        elapsed = time.perf_counter() - t0
        schedule = self.options.schedule.value
        self._timeline = Timeline.from_reports(schedule, reports, len(xs), t0, elapsed)
        samples = sum(len(x) for x in xs)
        return StepStats(loss_sum / norm, grad_norm, int(elapsed * 1e6), samples)

    async def _evaluate(self, group: StageGroup, msg: Evaluate) -> EvalResult:
        xs, ys, norm = self._batch(group, msg.features, msg.labels)
        reports = await group.run(self._next_pass(xs, ys, norm, train=False), self._resumed)
        samples = sum(len(x) for x in xs)
        accuracy = float("nan")
        if self.config.loss.is_classification:
            accuracy = reports[-1].correct / sum(y.size for y in ys)  # rows, or every token
        return evaluation(reports[-1].loss_sum, norm, accuracy, samples)

    # -- checkpoints --------------------------------------------------------

    async def _save(self, group: StageGroup, path: Any) -> None:
        weights, optimizer = await group.state()
        ckpt = Checkpoint(
            model=group.model_config,
            weights=weights,
            step=self.steps,
            optimizer=optimizer,
            extra={"trainer": "PipelineParallelTrainer"},
        )
        await asyncio.to_thread(save_checkpoint, path, ckpt)

    async def _load(self, group: StageGroup, path: Any) -> None:
        """Check the checkpoint, then load it into every stage, all or none
        (`StageGroup.load`)."""
        ckpt = await asyncio.to_thread(merge_shards, path)
        n = group.offsets[-1]
        check_model_matches(ckpt, group.model_config, n, group.spec.dtype)
        # validate the optimizer state on the whole vector before touching any stage
        check_optimizer_state(ckpt, self.config.optimizer, n, group.spec.dtype)
        accumulation = self.config.accumulation_steps
        check_resumable_window(ckpt, accumulation, "PipelineParallelTrainer")
        await group.load(split_checkpoint(ckpt, group.offsets))
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
        self._group = None
        group = await StageGroup.connect(self.stages, self.config)
        await self._load(group, message.path)
        if self._watch.clear(generation):
            self._group = group
