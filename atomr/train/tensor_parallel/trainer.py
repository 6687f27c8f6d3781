"""`TensorParallelTrainer`: each layer's weights split across shard actors.

The trainer splits the input, asks every shard, and routes the partial
outputs: each shard receives all partials of a stage and sums them itself
(an all-reduce whose arithmetic runs on the shards' devices). The built-in
`ShardActor` implements Megatron-LM's column-parallel / row-parallel pair
(see `atomr.train.tensor_parallel.sharding` and docs/tensor_parallel.md); any actor that
answers `ShardProtocol` (`atomr.train.tensor_parallel.messages`) can be a shard.

A `Step` is atomic. Phase 1 (forward stages, loss, backward stages) writes
only the shards' gradients; if any shard fails, the step is abandoned and no
weight changes. Phase 2 asks every shard to apply its optimizer to its slice
(each snapshots first); if one fails, the shards that applied roll back. The
asker sees the failing shard's own exception type.

Per step each shard runs two jobs per stage on its device (issue 22): the
loss goes with the last stage's backward (`ShardLoss.backward`), and without
clipping (the scale is then 1) each shard applies at the end of its stage-0
backward, unconfirmed (`ShardBackward.apply`), so that phase 2's
`ShardApply(1.0)` only confirms it, with no device work. If the step fails
instead (a shard, a non-finite norm), every unconfirmed update is undone by
its shard's next message, before anything reads it.

A shard actor that raises (rather than answering `Failure`) is resumed: its
state is still valid, since its updates are atomic. Only a `ContextPoisoned`
restarts it, with its initial slice and no optimizer state; the trainer
keeps no copy to restore it from, so it then answers every request with
`WorkerStateLost` until a `LoadCheckpoint` succeeds (`recovery.StateLossWatch`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from atomr.accel import Device
from atomr.actor import Actor, ActorRef, OneForOneStrategy, Props
from atomr.actor.supervision import SupervisorStrategy
from atomr.train._contract import (
    check_options,
    check_spawn_args,
    check_workers,
    refuse_accumulation,
    refuse_message,
    spawn_ready,
)
from atomr.train._recovery import StateLossWatch
from atomr.train.comm._fanout import set_learning_rate
from atomr.train.core._step_checks import check_gradient, check_step_limit, evaluation
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
from atomr.train.core.mlp import Mlp
from atomr.train.core.model.sequential import Sequential
from atomr.train.core.sharded_index import merge_shards
from atomr.train.core.stats import EvalResult, StepStats, TrainingState
from atomr.train.core.validation import validate_batch
from atomr.train.tensor_parallel._layer_trainer import LayerTensorParallelTrainer
from atomr.train.tensor_parallel.group import ShardGroup
from atomr.train.tensor_parallel.layer_shard import LayerShardActor
from atomr.train.tensor_parallel.options import TensorParallelOptions
from atomr.train.tensor_parallel.shard import ShardActor
from atomr.train.tensor_parallel.shard_plan import plan_shards
from atomr.train.tensor_parallel.sharding import check_shardable

__all__ = ["TensorParallelTrainer"]


class TensorParallelTrainer(Actor):
    """Trains an `Mlp` whose layers are split across N shard actors (any other
    model: `spawn` builds a `LayerTensorParallelTrainer`, split by its layers'
    rules).

    Answers `Step -> StepStats`, `GetWeights -> ndarray` (the full flat
    vector), `Evaluate -> EvalResult`, `SaveCheckpoint -> None` and
    `LoadCheckpoint -> None`, like `Trainer`, with the same results (float32
    tolerance) and interchangeable checkpoints. Every error is answered with
    `Failure(exc)`: bad input, a failing shard (its own exception type) or a
    bad checkpoint; nothing changes then.

    Build it with `spawn` (one built-in shard per device) or `props` (shards
    you built).

    Args:
        config: optimizer, loss, clipping and the shards' reply deadline
            (`worker_timeout`); `accumulation_steps` must be 1.
        shards: the shards in rank order (their number is the shard count):
            `ActorRef`s answering `ShardProtocol`, or `Props` of shards, which
            the trainer spawns as its children ("shard-0", ...).
        options: `TensorParallelOptions`, or None for the defaults.

    Raises:
        TypeError: `config`, `shards` or `options` of the wrong type (the
            shards neither all `ActorRef`s nor all `Props`).
        ValueError: no shards, one shard given twice, `accumulation_steps > 1`, or
            `options.shard_class` or `options.layer_shard_class` set (they
            are for `spawn`).
    """

    def __init__(
        self,
        config: TrainerConfig,
        shards: Sequence[ActorRef | Props],
        options: TensorParallelOptions | None = None,
    ) -> None:
        super().__init__()
        self.config, self._shards, self.options = _check_props(config, shards, options)
        self._group: ShardGroup | None = None
        self._watch = StateLossWatch("shard")
        self.steps = 0

    @classmethod
    def props(
        cls,
        config: TrainerConfig,
        shards: Sequence[ActorRef | Props],
        options: TensorParallelOptions | None = None,
    ) -> Props:
        """The `Props` of a trainer over shards you built (`ActorRef`s or `Props`).

        Args:
            config, shards, options: as for the class.

        Returns:
            The Props.

        Raises:
            TypeError, ValueError: as the class, checked here before anything
                is spawned.
        """
        _check_props(config, shards, options)
        return Props(cls, config, list(shards), options)

    @classmethod
    async def spawn(
        cls,
        system: Any,
        model: Sequential,
        devices: Sequence[Device | str],
        config: TrainerConfig,
        options: TensorParallelOptions | None = None,
        name: str | None = None,
    ) -> ActorRef:
        """Spawn a trainer with one shard (`options.shard_class`) per device,
        and wait until every shard holds its slice.

        Args:
            system: the `ActorSystem` (or a `Context`) to spawn in.
            model: the model to split (not modified).
            devices: one device per shard; their number is the shard count.
            config: as for the class.
            options: `TensorParallelOptions`, or None for the defaults.
            name: the trainer's name, or None.

        Returns:
            The trainer's `ActorRef`.

        Raises:
            TypeError: an argument of the wrong type (the message names it).
            ValueError: no devices, a bad device name,
                `config.accumulation_steps > 1`, a layer width smaller than
                the shard count, a model with `activate_last`, or a shard
                class for the other kind of model
                (`TensorParallelOptions.check_model`); all raised before
                anything is spawned.
        """
        checked, devs, config = check_spawn_args(system, model, devices, config, name)
        options = check_options(options, TensorParallelOptions, "TensorParallelTrainer")
        refuse_accumulation(config, "tensor-parallel")
        options.check_model(checked)
        if not isinstance(checked, Mlp):  # any other model: the layers' own rules
            plan = plan_shards(checked, len(devs))
            shard_class = options.layer_shard_class
            return await LayerTensorParallelTrainer.spawn_for(
                system, plan, devs, config, name, shard_class
            )
        model = checked
        if model.activate_last:
            raise ValueError("tensor parallelism does not support models with activate_last")
        n = len(devs)
        check_shardable(model.sizes, n)
        shards = [options.shard_class.props(model, rank, n, d) for rank, d in enumerate(devs)]
        props = cls.props(config, shards)
        return await spawn_ready(system, props, name, GetWeights(), config.worker_timeout)

    def supervisor_strategy(self) -> SupervisorStrategy:
        """Resume a shard that raised (its state is intact), stop it on
        `Unrecoverable`, restart it on `ContextPoisoned` and remember that its
        state is lost (`recovery.StateLossWatch`)."""
        return OneForOneStrategy(decider=self._watch.decide)

    def pre_start(self) -> None:
        """Spawn the shards given as `Props`, as children."""
        self._shards = [
            self.context.spawn(s, name=f"shard-{i}") if isinstance(s, Props) else s
            for i, s in enumerate(self._shards)
        ]

    async def _ready(self) -> ShardGroup:
        if self._group is None:
            refs = [s for s in self._shards if isinstance(s, ActorRef)]
            self._group = await ShardGroup.connect(refs, self.config)
        return self._group

    async def receive(self, message: Any) -> Any:
        """Dispatch a trainer message (see the class docstring); while a
        shard's state is lost, only `LoadCheckpoint` is served
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
            return await group.gather("params")
        if isinstance(message, SetLearningRate):
            return await set_learning_rate(
                self.config.optimizer, group.dtype, group.refs, message, group.timeout
            )
        if isinstance(message, SaveCheckpoint):
            return await self._save(group, message)
        if isinstance(message, LoadCheckpoint):
            return await self._load(group, message)
        return refuse_message("TensorParallelTrainer", message)

    def _validate(
        self, group: ShardGroup, features: Any, labels: Any
    ) -> tuple[np.ndarray, np.ndarray]:
        return validate_batch(
            features,
            labels,
            group.sizes[0],
            self.config.loss,
            out_width=group.sizes[-1],
            dtype=group.dtype,
        )

    async def _step(self, group: ShardGroup, message: Step) -> StepStats:
        x, y = self._validate(group, message.features, message.labels)
        t0 = time.perf_counter_ns()
        # phase 1: compute, touching no weight
        outs = await group.forward(x, train=True)
        clip = self.config.gradient_clip
        # unclipped, each shard applies at the end of its backward, unconfirmed
        # (a message round fewer); a failure or a non-finite norm leaves it to
        # be undone by the shard's next message
        result, grad_norm, _ = await group.loss_and_backward(outs, y, apply=clip is None)
        check_gradient(grad_norm)
        # phase 2: apply (or confirm) everywhere, or nowhere
        await group.apply(clip_coefficient(grad_norm, clip))
        self.steps += 1
        micros = (time.perf_counter_ns() - t0) // 1000
        return StepStats(result.loss_sum / result.normaliser, grad_norm, int(micros), x.shape[0])

    async def _evaluate(self, group: ShardGroup, message: Evaluate) -> EvalResult:
        x, y = self._validate(group, message.features, message.labels)
        outs = await group.forward(x, train=False)
        result = await group.loss(outs, y, train=False)
        accuracy = float("nan")
        if self.config.loss.is_classification:
            accuracy = result.correct / x.shape[0]
        return evaluation(result.loss_sum, result.normaliser, accuracy, x.shape[0])

    async def _save(self, group: ShardGroup, message: SaveCheckpoint) -> None:
        weights, optimizer, step = await group.state()
        ckpt = Checkpoint(
            model=dict(group.model),
            weights=weights,
            step=self.steps,
            optimizer=optimizer,
            extra={"trainer": "TensorParallelTrainer", "shard_count": len(group.refs)},
        )
        await asyncio.to_thread(save_checkpoint, message.path, ckpt)

    async def _load(
        self, group: ShardGroup, message: LoadCheckpoint, keep_old: bool = True
    ) -> None:
        """Check the checkpoint, then load it into every shard, all or none
        (`ShardGroup.load`; `keep_old` as there)."""
        ckpt = await asyncio.to_thread(merge_shards, message.path)
        check_model_matches(ckpt, group.model, group.total_params, group.dtype)
        check_optimizer_state(ckpt, self.config.optimizer, group.total_params, group.dtype)
        check_resumable_window(ckpt, self.config.accumulation_steps, "TensorParallelTrainer")
        step = int(ckpt.optimizer["step"])
        await group.load(ckpt.weights, ckpt.optimizer, step, keep_old=keep_old)
        self.steps = int(ckpt.step)

    async def _reload(self, message: LoadCheckpoint) -> None:
        """`LoadCheckpoint` after a shard lost its state: describe and configure
        every shard again (the restarted one has no optimizer), then give each
        its slice of the checkpoint. The trainer serves again only if this
        succeeds and no shard was restarted meanwhile.

        Raises:
            Exception: as `LoadCheckpoint`; the trainer keeps refusing (also
                when a shard restarted again meanwhile: `StateLossWatch.serve` answers
                that with `WorkerStateLost`).
        """
        generation = self._watch.generation
        refs = [s for s in self._shards if isinstance(s, ActorRef)]
        self._group = None
        group = await ShardGroup.connect(refs, self.config)
        await self._load(group, message, keep_old=False)  # the old state is lost anyway
        if self._watch.clear(generation):
            self._group = group


def _check_props(
    config: Any, shards: Any, options: Any
) -> tuple[TrainerConfig, list[Any], TensorParallelOptions]:
    """The checks of `TensorParallelTrainer.props` (see the class)."""
    config, items = check_workers(config, shards, "shards")
    options = check_options(options, TensorParallelOptions, "TensorParallelTrainer")
    refuse_accumulation(config, "tensor-parallel")
    for name, default in (("shard_class", ShardActor), ("layer_shard_class", LayerShardActor)):
        if getattr(options, name) is not default:
            raise ValueError(
                f"options.{name} is how spawn builds its shards; props takes shards already "
                f"built: leave it {default.__name__}"
            )
    return config, items, options
