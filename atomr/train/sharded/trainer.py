"""`ShardedDataParallelTrainer`: data parallel with the model's state sharded
across the replicas, as in ZeRO (stages 1-3), PyTorch FSDP and DeepSpeed.

Every replica trains on its shard of the batch, as in `DataParallelTrainer`,
but each owns only a piece of the flat parameter vector (`ShardLayout`) and
the optimizer state of that piece; stage 2 also keeps only its piece of the
reduced gradient, and stage 3 only its piece of the parameters, gathering
each layer when it runs (`ShardedReplica`, docs/sharded.md). Gradients are
reduce-scattered and parameters all-gathered through the `Collective`
interface (`_exchange`), across the processes of a job too.

It speaks the one trainer contract: `Step -> StepStats`, `Evaluate`,
`GetWeights` (the full vector), `SaveCheckpoint` / `LoadCheckpoint`
(`_checkpointing`; the full format, so checkpoints move between it and every other trainer;
`ShardedOptions.shard_checkpoints` writes one file per replica),
`GetTrainingState`, `SetLearningRate`; and its own `GetShardMemory ->
list[ShardMemory]`. In a multi-process job `Step`, `GetWeights`,
`SaveCheckpoint`, `LoadCheckpoint` and (stage 3) `Evaluate` are collective:
every process must ask them, in the same order (no process holds the
whole weights), unlike `DataParallelTrainer`'s local `GetWeights` and
`Evaluate`.

Faults: a step is atomic (`_passes`, `_update`), so a failure anywhere
changes no piece, of any process, and the asker gets the failing replica's
own error (on another process of a job: an `OtherProcessFailed` saying so, at
once: the failing process still joins the step's collectives). A replica
that raised is resumed with its piece intact. A step agreed but not completed
(a replica did not confirm its commit) is completed before the next
request is served, which fails instead while it cannot be (`_update`);
a `LoadCheckpoint` is not held up by it: it replaces every piece, all or
none, and is the way out of a commit that is never confirmed.
No replica holds another's piece, so one whose device context was
poisoned (restarted, its piece lost) makes the trainer answer
`WorkerStateLost` until a `LoadCheckpoint` re-syncs every replica from the
checkpointable state (`StateLossWatch`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from atomr.accel import Device
from atomr.accel.serial_worker import SerialWorker
from atomr.actor import (
    Actor,
    ActorRef,
    OneForOneStrategy,
    Props,
    SupervisorStrategy,
)
from atomr.train._contract import (
    check_options,
    check_spawn_args,
    refuse_message,
    spawn_ready,
)
from atomr.train._recovery import StateLossWatch
from atomr.train.comm._fanout import ask_all, set_learning_rate
from atomr.train.comm.collective import Collective, HostCollective
from atomr.train.comm.mpi.job import shard_for_rank
from atomr.train.comm.purpose import purpose
from atomr.train.core._step_checks import check_step_limit, evaluation
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
from atomr.train.core.models import batch_spec, model_from_config
from atomr.train.core.stats import EvalResult, StepStats, TrainingState
from atomr.train.data_parallel.messages import EvaluateShard, ShardEval
from atomr.train.sharded._checkpointing import ShardedCheckpoints
from atomr.train.sharded._construction import check_props, refuse_job_options, spawn_parts
from atomr.train.sharded._exchange import ShardExchange
from atomr.train.sharded._passes import ShardedPasses
from atomr.train.sharded.layout import ShardLayout
from atomr.train.sharded.messages import GetShardMemory, ShardMemory
from atomr.train.sharded.options import ShardedOptions

__all__ = ["ShardedDataParallelTrainer"]


class ShardedDataParallelTrainer(Actor):
    """Sharded data-parallel training (module docstring); build it with
    `spawn`, or with `props` over replicas you built.

    Args:
        model: the model (its config and initial weights).
        replicas: one `ShardedReplica` `Props` per local replica, in order.
        config: optimizer, loss, clipping, `worker_timeout` (each replica
            reply's deadline; None: forever); `accumulation_steps` must be 1.
        layout: the owned positions.
        options: the stage, collectives and job.
    """

    def __init__(
        self,
        model: Sequential,
        replicas: Sequence[Props],
        config: TrainerConfig,
        layout: ShardLayout,
        options: ShardedOptions,
    ) -> None:
        super().__init__()
        self.model_config = model.config()
        self._initial: Sequential | None = model  # until the processes start from process 0's
        self._spec = batch_spec(self.model_config)
        self.dtype = model.dtype
        self.config, self.layout, self.options = config, layout, options
        self._props = list(replicas)
        self.refs: list[ActorRef] = []
        self._watch = StateLossWatch("replica")
        self._host = SerialWorker("atomr-zero-host")
        self._collective, self._own_collective = _collective(options)
        self._exchange = ShardExchange(
            self._collective, options.process_collective, layout, self._host
        )
        self._passes: ShardedPasses | None = None
        self.steps = 0

    @classmethod
    def props(
        cls,
        model: Sequential,
        replicas: Sequence[Props],
        config: TrainerConfig,
        layout: ShardLayout,
        options: ShardedOptions | None = None,
    ) -> Props:
        """The `Props` of a trainer over replicas you built, for one process;
        every argument is checked here, before anything is spawned.

        Args:
            model: the model the replicas were built from (its config and
                initial weights).
            replicas: one `Props` per local replica, in order: replica `k`
                built with `layout` and index `k`, e.g.
                `Props(ShardedReplica, model, device, config, stage, layout, k)`
                (or a class of your own speaking `ShardedReplicaProtocol`).
                The trainer spawns them as its children.
            config: as for the class.
            layout: `ShardLayout.for_model(model, stage, len(replicas))`.
            options: `ShardedOptions` (None: stage 1); its `replica_class`
                is how `spawn` builds replicas, so it must be left the default.

        Returns:
            The Props.

        Raises:
            TypeError: an argument of the wrong type (the message names it):
                replicas given as `ActorRef`s included (the trainer spawns and
                supervises its own).
            ValueError: no replicas, `config.accumulation_steps > 1`, a
                replica that would own no parameter, a layout other than
                `ShardLayout.for_model`'s for these replicas, a
                `replica_class` other than `ShardedReplica`, or options with a
                `process_collective`: a job of several processes must start
                with `spawn`, which has the processes agree that all started
                and gives every process process 0's weights.
        """
        job = check_options(options, ShardedOptions, cls.__name__)
        refuse_job_options(job)
        return Props(cls, *check_props(model, replicas, config, layout, job))

    @classmethod
    async def spawn(
        cls,
        system: Any,
        model: Sequential,
        devices: Sequence[Device | str],
        config: TrainerConfig,
        options: ShardedOptions | None = None,
        name: str | None = None,
    ) -> ActorRef:
        """Spawn a trainer with one `ShardedReplica` per device and wait until
        every replica holds its piece. Every argument is checked first.

        Args:
            system: the `ActorSystem` (or a `Context`) to spawn in.
            model: the model (not modified).
            devices: one device per local replica, all CPU or all CUDA.
            config: as for the class.
            options: `ShardedOptions` (None: stage 1, one process).
            name: the trainer's actor name, or None.

        In a job, every process first starts its replicas (from its own
        `model`), then the processes agree whether any failed (`spawn_ready`),
        and only then broadcast process 0's weights, which the replicas of
        the other processes take: a failure on one process (a replica that
        cannot start, a layout only it refuses) fails every process's spawn
        at once, the others' naming its rank.

        Returns:
            The trainer's `ActorRef`.

        Raises:
            TypeError: an argument of the wrong type (the message names it).
            ValueError: no devices, a bad device name, CPU and CUDA mixed,
                `config.accumulation_steps > 1`, or a replica that would own
                no parameter (more replicas than the model can be cut into).
            Exception: what a replica raised while starting (the trainer
                and its replicas are stopped), or the process collective's
                error (the agreement, the broadcast).
            OtherProcessFailed: in a job, another process failed to start; its
                rank is named.
        """
        job = check_options(options, ShardedOptions, cls.__name__)

        def made() -> Props:
            checked, devs, conf = check_spawn_args(system, model, devices, config, name)
            if job.process_collective is not None:  # process 0's weights: of no seed, alike on all
                checked = model_from_config(checked.config(), checked.get_params())
            replicas, layout = spawn_parts(checked, devs, conf, job)
            return Props(cls, *check_props(checked, replicas, conf, layout, job))

        then = None if job.process_collective is None else _FromProcessZero()
        return await spawn_ready(system, made, name, GetShardMemory(), None, job=job, then=then)

    def supervisor_strategy(self) -> SupervisorStrategy:
        """Resume a replica that raised (its piece is intact); restart one whose
        device context was poisoned and remember its piece is lost."""
        return OneForOneStrategy(decider=self._watch.decide)

    def pre_start(self) -> None:
        """Spawn the replicas as children."""
        self.refs = [self.context.spawn(p, name=f"replica-{k}") for k, p in enumerate(self._props)]
        o = self.options
        self._passes = ShardedPasses(
            self.config, o.stage, self._exchange, self.refs, self._host, self.dtype
        )
        self.checkpoints = ShardedCheckpoints(
            self.config, o, self.layout, self.model_config, self.dtype, self._exchange,
            self._host, self.refs, self._ask,
        )  # fmt: skip

    def post_stop(self) -> None:
        """Close the host thread and the collective this trainer made."""
        if self._own_collective:
            self._collective.close()
        self._host.close()

    async def receive(self, message: Any) -> Any:
        """Dispatch a trainer message; while a replica's piece is lost only
        `LoadCheckpoint` is served (`StateLossWatch.serve`)."""
        return await self._watch.serve(message, self._dispatch, self._load)

    async def _dispatch(self, message: Any) -> Any:
        passes = self._passes
        assert passes is not None
        if isinstance(message, LoadCheckpoint):  # every piece replaced: nothing to complete
            return await self._load(message)
        with purpose("complete step"):  # whichever request comes next: the same everywhere
            if await passes.update.complete(type(message).__name__):
                self.steps += 1  # the last step, completed only now
        if isinstance(message, Step):
            check_step_limit(self.steps, self.config.max_steps)
            with purpose("step"):
                return await self._step(passes, message)
        if isinstance(message, Evaluate):
            with purpose("evaluate"):
                return await self._evaluate(passes, message)
        if isinstance(message, GetWeights):
            with purpose("gather weights"):
                return (await self.checkpoints.full_state())[0]
        if isinstance(message, _FromProcessZero):
            with purpose("sync weights"):
                return await self._from_process_zero()
        if isinstance(message, GetShardMemory):
            memory: list[ShardMemory] = await self._ask([message] * len(self.refs))
            return memory
        if isinstance(message, GetTrainingState):
            return TrainingState(self.steps, self.config.max_steps, self.options.process_rank == 0)
        if isinstance(message, SetLearningRate):
            timeout = self.config.worker_timeout
            return await set_learning_rate(
                self.config.optimizer, self.dtype, self.refs, message, timeout
            )
        if isinstance(message, SaveCheckpoint):
            with purpose("save checkpoint"):
                return await self.checkpoints.save(Path(message.path), self.steps)
        return refuse_message(type(self).__name__, message)

    async def _ask(self, messages: list[Any]) -> list[Any]:
        """Every replica's answer, each within `worker_timeout`.

        Raises:
            Exception: the first failing replica's own error (`ask_all`).
        """
        return await ask_all(self.refs, messages, self.config.worker_timeout)

    async def _from_process_zero(self) -> None:
        """Every local replica takes process 0's initial weights
        (`ShardedCheckpoints.from_process_zero`), once.

        Raises:
            RuntimeError: asked again.
            Exception: the collective's error, or a replica's own.
        """
        if self._initial is None:
            raise RuntimeError("the replicas took process 0's initial weights already")
        weights, self._initial = self._initial.get_params(), None
        await self.checkpoints.from_process_zero(weights)

    async def _load(self, message: LoadCheckpoint) -> None:
        """Load a checkpoint into every replica of every process, all or
        none (`ShardedCheckpoints.load`); a lost piece is then restored, and
        a step whose commit was unconfirmed is dropped for it.

        Raises:
            CheckpointError: the checkpoint does not fit, or another process
                failed to load it (nothing changed).
            Exception: a replica's own error (every replica's state restored;
                but out of an unconfirmed commit there is no whole old state,
                so only a load is served until one succeeds).
        """
        assert self._passes is not None
        update = self._passes.update
        generation = self._watch.generation
        unconfirmed = update.unconfirmed
        keep_old = self._watch.lost() is None and not unconfirmed
        try:
            with purpose("load checkpoint"):
                self.steps = await self.checkpoints.load(Path(message.path), keep_old)
        except Exception as error:
            if unconfirmed:
                update.load_failed(error)
            raise
        update.forget()  # every replica holds the checkpoint's state instead
        self._watch.clear(generation)

    def _validate(self, message: Step | Evaluate) -> tuple[np.ndarray, np.ndarray]:
        return self._spec.validate(message.features, message.labels, self.config.loss)

    async def _step(self, passes: ShardedPasses, message: Step) -> StepStats:
        x, y = self._validate(message)
        rows = int(x.shape[0])
        o = self.options
        offset = 0
        if o.process_count > 1:
            share = shard_for_rank(rows, o.process_rank, o.process_count)
            x, y, offset = x[share], y[share], int(share.start or 0)
        stats = await passes.step(x, y, rows, offset)
        self.steps += 1
        return stats

    async def _evaluate(self, passes: ShardedPasses, message: Evaluate) -> EvalResult:
        x, y = self._validate(message)
        if self.options.stage == 3:
            loss_sum, norm, correct = await passes.evaluate(x, y)
        else:
            msgs = [EvaluateShard(xs, ys) for xs, ys in passes.shards(x, y)]
            parts: list[ShardEval] = await self._ask(msgs)
            loss_sum = sum(p.loss_sum for p in parts)
            norm, correct = sum(p.normaliser for p in parts), sum(p.correct for p in parts)
        accuracy = correct / y.size if self.config.loss.is_classification else float("nan")
        return evaluation(loss_sum, norm, accuracy, x.shape[0])


@dataclass(frozen=True)
class _FromProcessZero:
    """Sent by `spawn` in a job, once every process started its replicas:
    every process takes process 0's initial weights (a broadcast)."""


def _collective(options: ShardedOptions) -> tuple[Collective, bool]:
    """The local collective, and whether this trainer made it (and closes it)."""
    if isinstance(options.collective, Collective):
        return options.collective, False
    return HostCollective(), True
