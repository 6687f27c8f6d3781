"""`DataParallelTrainer`: one model replicated on N devices, each replica an
actor; a step splits the batch, every replica computes its shard's gradient
at once, the gradients are all-reduced and every replica applies the same
optimizer step (see docs/data_parallel.md).

A step is atomic (`_step`): if it fails anywhere, no weight changes
anywhere. A replica that failed is restarted by its supervisor (this
trainer, for the replicas it spawned) and re-synced from a healthy one
(`_replicas`); the asker gets the replica's own exception, and the next
step works. A replica this trainer resumes (`OutOfMemory`) during an
all-reduce among the replicas may have lost a told message: the all-reduce
is interrupted at once and the step fails with that exception. Bad input
is answered with `Failure(exc)` and changes nothing. Checkpoints: `_checkpoints`.

In a multi-process job (`DataParallelOptions.for_job`) every process runs
one of these trainers over its local devices, and each is sent the same
messages: `Step` takes the global batch, and each process trains on its
`shard_for_rank` share; the processes' sums are added through the process
collective, so N processes x M replicas equal one device on the global batch.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from atomr.accel import Device
from atomr.accel.serial_worker import SerialWorker
from atomr.actor import (
    Actor,
    ActorRef,
    Directive,
    Failure,
    OneForOneStrategy,
    Props,
    SupervisorStrategy,
)
from atomr.train._contract import check_options, refuse_message, spawn_ready
from atomr.train._recovery import ResumedCrashWatch, worker_decider
from atomr.train.comm._fanout import set_learning_rate
from atomr.train.comm.mpi.job import shard_for_rank
from atomr.train.comm.purpose import purpose
from atomr.train.core._step_checks import check_step_limit, evaluation
from atomr.train.core.config import TrainerConfig
from atomr.train.core.messages import (
    CloseRound,
    Evaluate,
    GetTrainingState,
    GetWeights,
    LoadCheckpoint,
    SaveCheckpoint,
    SetLearningRate,
    Step,
)
from atomr.train.core.model.sequential import Sequential
from atomr.train.core.stats import EvalResult, StepStats, TrainingState
from atomr.train.core.validation import detached
from atomr.train.data_parallel._cadence import Cadence
from atomr.train.data_parallel._checkpoints import Checkpoints
from atomr.train.data_parallel._construction import check_props, made_collective, spawn_replicas
from atomr.train.data_parallel._local_sgd import LocalSgd
from atomr.train.data_parallel._manual import MANUAL_VERBS, ManualVerbs
from atomr.train.data_parallel._reduction import GradientReduction
from atomr.train.data_parallel._replicas import ReplicaGroup
from atomr.train.data_parallel._step import StepRunner
from atomr.train.data_parallel.messages import (
    EvaluateShard,
    GetDevice,
    GetDevices,
    GetReplicaWeights,
    SetReplicas,
    ShardEval,
)
from atomr.train.data_parallel.options import ApplyPolicy, DataParallelOptions
from atomr.train.data_parallel.replica import worker_deadline

__all__ = ["DataParallelTrainer", "replica_decider"]

logger = logging.getLogger(__name__)

# what sees a CADENCE round closed first: the manual verbs (the round's batches
# are in the gradient buffers they use) and a checkpoint (it holds every batch)
_AFTER_ROUND = (*MANUAL_VERBS, SaveCheckpoint)

replica_decider = worker_decider
"""How the trainer supervises the replicas it spawned (`_recovery.worker_decider`):
STOP for `Unrecoverable` (the trainer goes on with the others), RESUME for
`OutOfMemory` (the replica is re-synced anyway), RESTART for anything else."""


class DataParallelTrainer(Actor):
    """Data-parallel training over replica actors (module docstring).

    Answers `Step -> StepStats` (`samples`: the rows of the whole batch),
    `Evaluate -> EvalResult`, `GetWeights -> ndarray` (replica 0's),
    `SaveCheckpoint`, `LoadCheckpoint` (the checkpoint format of every
    trainer), and its own `GetReplicaWeights -> list` and `SetReplicas`
    (`atomr.train.data_parallel.messages`).

    Args:
        config: optimizer, loss, clipping, `accumulation_steps` (K: the
            replicas accumulate K micro-batches locally and synchronise
            once) and `worker_timeout` (the wait for any replica's reply).
        replicas: the replicas in rank order: `ActorRef`s of actors answering
            `ReplicaProtocol` (supervised by whoever spawned them), or
            `Props` that this trainer spawns as its children and supervises
            (`replica_decider`). May be empty until `SetReplicas`.
        options: collective, balancing, checks and the multi-process job
            (`DataParallelOptions`); None: the defaults.

    Raises:
        TypeError: an argument has the wrong type; the message names it.
        ValueError: `options.speed_hint` does not have one entry per replica,
            or `options.replica_class` is not `ReplicaActor` (it says how
            `spawn` builds replicas; these are built already).
    """

    def __init__(
        self,
        config: TrainerConfig,
        replicas: Sequence[ActorRef | Props] = (),
        options: DataParallelOptions | None = None,
    ) -> None:
        super().__init__()
        self.config, self._initial, self.options = check_props(config, replicas, options)
        self.replicas = ReplicaGroup(worker_deadline(config))
        self._collective, self._owns_collective = made_collective(self.options, config)
        self._host = SerialWorker("atomr-dp-host")
        self._resumed = ResumedCrashWatch()
        reduction = GradientReduction(
            self._collective,
            self.options.process_collective,
            self.replicas,
            self._resumed,
            self._host,
            config.gradient_clip,
        )
        self._runner = StepRunner(config, self.options, self.replicas, reduction)
        self._checkpoints = Checkpoints(
            config, self.options, self.replicas, self._runner, self._host
        )
        self._manual = ManualVerbs(config, self.options, self.replicas, self._runner)
        o = self.options
        self._local = LocalSgd(
            self._runner, o.average_every, o.average_seconds, self._host, o.speed_hint, o.clock
        )
        self._cadence = Cadence(self._runner, self.options)

    # -- construction -------------------------------------------------------

    @classmethod
    def props(
        cls,
        config: TrainerConfig,
        replicas: Sequence[ActorRef | Props] = (),
        options: DataParallelOptions | None = None,
    ) -> Props:
        """The `Props` of a trainer over the given replicas, its arguments
        checked (see the class).

        Returns:
            The Props.

        Raises:
            TypeError, ValueError: as for the class.
        """
        _, checked, _ = check_props(config, replicas, options)
        return Props(cls, config, checked, options)

    @classmethod
    async def spawn(
        cls,
        system: Any,
        model: Sequential,
        devices: Sequence[Device | str],
        config: TrainerConfig,
        options: DataParallelOptions | None = None,
        name: str | None = None,
    ) -> ActorRef:
        """Spawn a trainer with one replica (`options.replica_class`) of
        `model` per device, numbered in device order (`index`), and wait
        until the replicas hold replica 0's weights (in a job: process 0's).
        Every argument is checked before anything is spawned.

        Args:
            system: the `ActorSystem` (or a `Context`) to spawn in.
            model: the model (copied onto each device).
            devices: one device per replica (e.g. `cpu_devices(2)`), all CPU
                devices or all CUDA devices (several replicas may share one).
                CPU and CUDA kernels round differently, so replicas on both
                kinds would drift apart instead of staying bit-identical.
            config, options: as for the class.
            name: the trainer's actor name, or None.

        In a job, every process first starts its replicas (`GetDevices`),
        then the processes agree whether any failed (`spawn_ready`), and only
        then broadcast process 0's weights: a failure on one process fails
        every process's spawn at once, the others' naming its rank.

        Returns:
            The trainer's `ActorRef`. The wait has no deadline of its own:
            each wait inside it has one (`config.worker_timeout` for the
            replicas, the process collective's own in a job).

        Raises:
            TypeError: an argument has the wrong type; the message names it.
            ValueError: no devices, a bad device name, CPU and CUDA devices
                mixed, or `options.speed_hint` not one per device.
            Exception: what the replicas or the process collective raised
                while starting (the trainer is stopped then).
            OtherProcessFailed: in a job, another process failed to start (a
                bad argument there included); its rank is named.
        """
        job = check_options(options, DataParallelOptions, cls.__name__)

        def made() -> Props:
            checked, replicas, built = spawn_replicas(
                system, model, devices, config, job, name, cls.__name__
            )
            return cls.props(checked, replicas, built)

        return await spawn_ready(system, made, name, GetDevices(), None, job=job, then=GetWeights())

    def supervisor_strategy(self) -> SupervisorStrategy:
        """`replica_decider` for the replicas this trainer spawned."""
        return OneForOneStrategy(decider=self._decide)

    def _decide(self, error: BaseException) -> Directive:
        """`replica_decider`; a replica resumed during an all-reduce among
        the replicas also ends it."""
        return self._resumed.note(replica_decider(error), error)

    def pre_start(self) -> None:
        """Spawn the replicas given as `Props`."""
        refs = []
        for k, r in enumerate(self._initial):
            refs.append(self.context.spawn(r, name=f"replica-{k}") if isinstance(r, Props) else r)
        self.replicas.replace(refs)

    def post_stop(self) -> None:
        """Stop the host thread (and the host collective this trainer made)."""
        if self._owns_collective:
            self._collective.close()
        self._host.close()

    # -- messages -----------------------------------------------------------

    async def receive(self, message: Any) -> Any:
        """Dispatch a trainer message (see the class docstring)."""
        try:
            if isinstance(message, SetReplicas):
                return await self._on_set_replicas(message)
            if not self.replicas.refs:
                return Failure(RuntimeError("no replicas: send SetReplicas first"))
            lost = self.replicas.lost
            if lost is not None and not isinstance(message, LoadCheckpoint):
                return Failure(
                    RuntimeError(
                        f"every replica failed ({lost!r}); their state is lost: "
                        "send LoadCheckpoint to go on"
                    )
                )
            if isinstance(message, GetDevices):  # local: `spawn` asks it before the first sync
                return tuple(await self.replicas.gather(GetDevice()))
            await self.replicas.sync(self.options.process_collective)
            return await self._answer(message)
        except Exception as exc:  # every failure is answered; replicas are repaired below
            return Failure(exc)

    async def _answer(self, message: Any) -> Any:
        if isinstance(message, Step):
            return await self._step(message)
        if isinstance(message, GetReplicaWeights):
            await self._local.drain()
            return await self.replicas.gather(GetWeights())
        if isinstance(message, GetTrainingState):
            coordinator = self.options.process_rank == 0
            rounds = self.options.policy is not ApplyPolicy.SYNC
            return TrainingState(self._runner.steps, self.config.max_steps, coordinator, rounds)
        if isinstance(message, LoadCheckpoint):  # it replaces every replica's state
            await self._drop_open_round("LoadCheckpoint")
            with purpose("load checkpoint"):
                return await self._checkpoints.load(message.path)
        # every other message sees the replicas averaged (ASYNC)
        closed = await self._local.close()
        if isinstance(closed, Failure) or isinstance(message, CloseRound):
            return closed if closed is not None else await self._cadence.close()
        if isinstance(message, GetWeights):
            return await self.replicas.refs[0].ask(GetWeights(), timeout=self.replicas.timeout)
        if isinstance(message, _AFTER_ROUND):
            # the open round's batches: in the gradient buffers the verbs use, and
            # in what a checkpoint holds; a round that failed to close is answered
            closed = await self._cadence.close()
            if isinstance(closed, Failure):
                return closed
            if isinstance(message, SaveCheckpoint):
                with purpose("save checkpoint"):
                    return await self._checkpoints.save(message.path)
            return await self._manual.answer(message)
        if isinstance(message, SetLearningRate):
            group, kind = self.replicas, self.config.optimizer  # a restarted replica is re-synced
            dtype, refs = group.spec().dtype, group.refs
            return await set_learning_rate(
                kind, dtype, refs, message, group.timeout, group.resync_crashed
            )
        if isinstance(message, Evaluate):
            return await self._evaluate(message)
        return refuse_message("DataParallelTrainer", message)

    async def _on_set_replicas(self, message: SetReplicas) -> None:
        refs = list(message.replicas)
        for k, r in enumerate(refs):
            if not isinstance(r, ActorRef):
                raise TypeError(f"replicas[{k}] must be an ActorRef, got {type(r).__name__}")
        self.options.replica_count_fits(len(refs))
        await self._drop_open_round("SetReplicas")  # the new replicas are synced below
        self.replicas.replace(refs)
        self._manual.forget()
        self.replicas.lost = None
        self._runner.window.reset()
        if refs:
            await self.replicas.sync(self.options.process_collective)

    async def _drop_open_round(self, why: str) -> None:
        """Before `why` (`LoadCheckpoint`, `SetReplicas`) replaces the replicas'
        state or the replicas: close an open ASYNC or CADENCE round on the
        replicas that computed its batches. A round that fails to close (its
        crashed replicas re-synced, its batches dropped) does not stop `why`,
        which replaces what the round would have changed; its failure is
        logged as a warning, not answered."""
        for closed in (await self._local.close(), await self._cadence.close()):
            if isinstance(closed, Failure):
                logger.warning(
                    "DataParallelTrainer: the open round failed to close before %s "
                    "(its batches are dropped): %r",
                    why,
                    closed.exception,
                )

    def _validate(self, message: Step | Evaluate) -> tuple[np.ndarray, np.ndarray]:
        return self.replicas.spec().validate(message.features, message.labels, self.config.loss)

    async def _step(self, message: Step) -> StepStats | Failure:
        """Validate the batch; in a job, take this process's share of it.
        Under CADENCE and ASYNC the `Step` answers before its batch is
        applied, so the trainer keeps a copy: the sender may refill its
        arrays for the next batch (a loader's reused buffer; one validation
        already cast is not copied again). Under SYNC a
        replica late past `worker_timeout` may read its rows after the `Step`
        answered, but its gradient is never applied: no copy."""
        check_step_limit(self._runner.steps, self.config.max_steps)
        x, y = self._validate(message)
        self._manual.forget()  # the step overwrites the replicas' gradient buffers
        rows = int(x.shape[0])
        o, offset = self.options, 0
        if o.process_collective is not None:
            share = shard_for_rank(rows, o.process_rank, o.process_count)
            x, y, offset = x[share], y[share], int(share.start or 0)
        if o.policy is not ApplyPolicy.SYNC:  # copied unless validation made them anew
            x, y = detached(x, message.features), detached(y, message.labels)
        if o.policy is ApplyPolicy.ASYNC:
            return await self._local.step(x, y, rows)
        if o.policy is ApplyPolicy.CADENCE:
            return await self._cadence.step(x, y, rows)
        return await self._runner.step(x, y, rows, offset)

    async def _evaluate(self, message: Evaluate) -> EvalResult:
        """Loss and accuracy of the whole batch, sharded over the local replicas.

        Raises:
            InvalidBatchError: bad input (targets all of class weight 0 are
                not: their loss is NaN, `evaluation`).
        """
        x, y = self._validate(message)
        msgs = [EvaluateShard(xs, ys) for xs, ys in self._runner.shards(x, y)]
        parts: list[ShardEval] = await self.replicas.gather_each(msgs)
        norm = sum(p.normaliser for p in parts)
        accuracy = float("nan")
        if self.config.loss.is_classification:
            accuracy = sum(p.correct for p in parts) / y.size  # rows, or every token
        return evaluation(sum(p.loss_sum for p in parts), norm, accuracy, x.shape[0])
