"""`LayerTensorParallelTrainer`: Megatron-style tensor parallelism for any
`Sequential` (a GPT: MLP blocks split column then row, attention by heads,
LayerNorm and the embedding replicated, the output projection split by
columns and gathered). `TensorParallelTrainer.spawn` builds it for any model
other than an `Mlp`.

Every shard (`LayerShardActor`) sees the whole batch and runs the whole pass
on its device thread; the shards meet mid-pass in a `ThreadGroup`
(`shard_plan` says where). A step is atomic: the pass changes no weight;
then every shard updates its part out of place and keeps it only when all
have (else every shard rolls back), and the asker gets the failing shard's
own error, once every shard is done with the failed pass (`_settle`: a
shard late past `worker_timeout` never meets the next pass). A shard that
raised is resumed (its state is intact); one whose device context was
poisoned loses its part, and the trainer answers `WorkerStateLost` until a
checkpoint is loaded (`StateLossWatch`).
Checkpoints are the full format: the shards' parts merged.
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
    OneForOneStrategy,
    Props,
    SupervisorStrategy,
)
from atomr.train._contract import refuse_message, spawn_ready
from atomr.train._recovery import StateLossWatch
from atomr.train.comm._fanout import (
    ask_all,
    ask_all_settled,
    ask_all_settled_or_abort,
    failed_indices,
    fence,
    load_all_or_none,
    name_failures,
    set_learning_rate,
)
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
from atomr.train.core.models import batch_spec
from atomr.train.core.sharded_index import merge_shards
from atomr.train.core.stats import EvalResult, StepStats, TrainingState
from atomr.train.tensor_parallel._thread_group import GroupBroken, ThreadGroup
from atomr.train.tensor_parallel.layer_messages import (
    LayerShardState,
    PassResult,
    ShardApply,
    ShardCommit,
    ShardPass,
    ShardRollback,
    ShardStateGet,
    ShardStateSet,
)
from atomr.train.tensor_parallel.layer_shard import LayerShardActor
from atomr.train.tensor_parallel.shard_plan import ShardPlan

__all__ = ["LayerTensorParallelTrainer"]


def _first_own_error(results: list[Any]) -> BaseException:
    """The failure to report, `worker_index` set: the first that is not a
    shard woken by another's."""
    name_failures(results)
    errors = [r for r in results if isinstance(r, BaseException)]
    own = [e for e in errors if not isinstance(e, GroupBroken)]
    return (own or errors)[0]


def _still_busy(late: list[int]) -> str:
    return f"tensor-parallel shards {late} are still busy with a failed pass (or stopped)"


class LayerTensorParallelTrainer(Actor):
    """Tensor-parallel training of any model (module docstring); build it with
    `TensorParallelTrainer.spawn`.

    Args:
        plan: the model's shard plan (its initial weights included).
        devices: one device per shard.
        config: optimizer, loss, clipping, `worker_timeout` (each shard's
            reply, and each mid-pass wait); `accumulation_steps` must be 1.
        shard_class: `LayerShardActor` or a subclass.
    """

    def __init__(
        self,
        plan: ShardPlan,
        devices: Sequence[Device],
        config: TrainerConfig,
        shard_class: type[LayerShardActor] = LayerShardActor,
    ) -> None:
        super().__init__()
        self.plan, self.devices, self.config = plan, list(devices), config
        self.shard_class = shard_class
        self.group = ThreadGroup(len(self.devices), config.worker_timeout)
        self.spec = batch_spec(plan.model.config())
        self.refs: list[ActorRef] = []
        self._watch = StateLossWatch("shard")
        self._token = 0
        self.steps = 0

    @classmethod
    async def spawn_for(
        cls,
        system: Any,
        plan: ShardPlan,
        devices: Sequence[Device],
        config: TrainerConfig,
        name: str | None,
        shard_class: type[LayerShardActor] = LayerShardActor,
    ) -> ActorRef:
        """Spawn the trainer and its shards; wait until every shard holds its part.

        Raises:
            Exception: what a shard raised while starting (the trainer is stopped).
        """
        props = Props(cls, plan, list(devices), config, shard_class)
        return await spawn_ready(system, props, name, GetWeights(), config.worker_timeout)

    def supervisor_strategy(self) -> SupervisorStrategy:
        """Resume a shard that raised; remember one restarted with its part lost."""
        return OneForOneStrategy(decider=self._watch.decide)

    def pre_start(self) -> None:
        """Spawn the shards as children."""
        for k, device in enumerate(self.devices):
            props = Props(self.shard_class, self.plan, k, self.group, device, self.config)
            self.refs.append(self.context.spawn(props, name=f"shard-{k}"))

    async def receive(self, message: Any) -> Any:
        """Dispatch a trainer message; while a shard's part is lost only
        `LoadCheckpoint` is served."""
        return await self._watch.serve(message, self._dispatch, self._load)

    async def _dispatch(self, message: Any) -> Any:
        if isinstance(message, Step):
            check_step_limit(self.steps, self.config.max_steps)
            return await self._step(message)
        if isinstance(message, Evaluate):
            return await self._evaluate(message)
        if isinstance(message, GetWeights):
            return self.plan.merge([s.params for s in await self._states()])
        if isinstance(message, GetTrainingState):
            return TrainingState(self.steps, self.config.max_steps)
        if isinstance(message, SetLearningRate):
            timeout = self.config.worker_timeout
            return await set_learning_rate(
                self.config.optimizer, self.spec.dtype, self.refs, message, timeout
            )
        if isinstance(message, SaveCheckpoint):
            return await self._save(message)
        if isinstance(message, LoadCheckpoint):
            return await self._load(message)
        return refuse_message("TensorParallelTrainer", message)

    async def _pass(self, x: np.ndarray, y: np.ndarray, train: bool) -> list[PassResult]:
        """Every shard's pass; a failure is raised once every shard is done
        with it (`_settle`).

        Raises:
            GroupBroken: a shard is still busy with an earlier failed pass
                (nothing was sent).
            Exception: the failing shard's own error; no weight changed.
        """
        if self.group.broken and (late := await self._settle()):
            raise GroupBroken(f"{_still_busy(late)}; nothing was sent, try again later")
        msg = ShardPass(x, y, train, self.steps)
        results = await ask_all_settled_or_abort(
            self.refs, [msg] * len(self.refs), self._wake, self.config.worker_timeout
        )
        if failed_indices(results):
            error = _first_own_error(results)
            error.add_note("the pass failed: no shard changed its weights")
            if late := await self._settle():
                error.add_note(f"{_still_busy(late)}; the next request waits for them first")
            raise error
        return results

    async def _wake(self) -> None:
        """Wake the shards waiting mid-pass: a shard's ask failed, and one
        that failed before its pass began (its actor raised) never comes."""
        self.group.abort()

    async def _settle(self) -> list[int]:
        """Make the group usable again once no shard is in a pass: wake the
        shards waiting mid-pass (`abort`), wait for each to finish what it
        was given (`fence`, at most `worker_timeout`), then `reset`. A shard
        whose ask timed out may still be computing; met by a reset group, it
        would pair a failed pass's data with the next pass's.

        Returns:
            The shards that did not finish in time; while there are any, the
            group stays broken.
        """
        self.group.abort()
        late = await fence(self.refs, self.config.worker_timeout)
        if not late:
            self.group.reset()
        return late

    async def _step(self, message: Step) -> StepStats:
        t0 = time.perf_counter_ns()
        x, y = self.spec.validate(message.features, message.labels, self.config.loss)
        results = await self._pass(x, y, train=True)
        grad_norm = math.sqrt(sum(r.squared_norm for r in results))
        check_gradient(grad_norm)
        await self._apply(clip_coefficient(grad_norm, self.config.gradient_clip))
        self.steps += 1
        first = results[0]
        micros = (time.perf_counter_ns() - t0) // 1000
        return StepStats(first.loss_sum / first.normaliser, grad_norm, int(micros), int(x.shape[0]))

    async def _apply(self, coefficient: float) -> None:
        """Every shard updates and keeps it, or none does (all roll back).

        Once every shard applied, the new state is current everywhere and the
        step is done: `ShardCommit` only frees the old state, so a shard that
        fails it is not an error (its next `ShardApply` commits first).

        Raises:
            Exception: the first failing shard's own, after every shard rolled back.
        """
        self._token += 1
        token, timeout = self._token, self.config.worker_timeout
        results = await ask_all_settled(
            self.refs, ShardApply(coefficient, token), timeout, per_worker=False
        )
        if failed_indices(results):
            await ask_all_settled(self.refs, ShardRollback(token), timeout, per_worker=False)
            raise _first_own_error(results)
        await ask_all_settled(self.refs, ShardCommit(token), timeout, per_worker=False)

    async def _evaluate(self, message: Evaluate) -> EvalResult:
        x, y = self.spec.validate(message.features, message.labels, self.config.loss)
        first = (await self._pass(x, y, train=False))[0]
        accuracy = first.correct / y.size if self.config.loss.is_classification else float("nan")
        return evaluation(first.loss_sum, first.normaliser, accuracy, int(x.shape[0]))

    async def _states(self) -> list[LayerShardState]:
        states: list[LayerShardState] = await ask_all(
            self.refs, ShardStateGet(), self.config.worker_timeout, per_worker=False
        )
        return states

    async def _save(self, message: SaveCheckpoint) -> None:
        states = await self._states()
        optimizer: dict[str, Any] = {}
        for key, value in states[0].optimizer.items():
            is_buffer = isinstance(value, np.ndarray)
            optimizer[key] = (
                self.plan.merge([s.optimizer[key] for s in states]) if is_buffer else value
            )
        weights = self.plan.merge([s.params for s in states])
        extra = {"trainer": "TensorParallelTrainer", "shard_count": len(self.refs)}
        ckpt = Checkpoint(self.plan.model.config(), weights, self.steps, optimizer, extra)
        await asyncio.to_thread(save_checkpoint, message.path, ckpt)

    async def _load(self, message: LoadCheckpoint) -> None:
        """Check the checkpoint, then give every shard its part, all or none:
        if a shard fails, every shard gets its state from before the load
        back (`load_all_or_none`), unless a shard had lost it anyway.

        Raises:
            CheckpointError: a bad checkpoint (nothing was sent).
            Exception: the first failing shard's own (`worker_index` set).
        """
        generation = self._watch.generation
        ckpt = await asyncio.to_thread(merge_shards, message.path)
        model = self.plan.model
        check_model_matches(ckpt, model.config(), model.n_params, model.dtype)
        check_optimizer_state(ckpt, self.config.optimizer, model.n_params, model.dtype)
        check_resumable_window(ckpt, self.config.accumulation_steps, "TensorParallelTrainer")
        weights = self.plan.split(np.asarray(ckpt.weights, dtype=model.dtype))
        buffers = {
            k: self.plan.split(v) for k, v in ckpt.optimizer.items() if isinstance(v, np.ndarray)
        }
        states = []
        for k, part in enumerate(weights):
            state = {
                key: (buffers[key][k] if key in buffers else v) for key, v in ckpt.optimizer.items()
            }
            states.append(ShardStateSet(LayerShardState(part, state, int(ckpt.step))))
        old = None
        if self._watch.lost() is None:  # else a shard's state is gone: nothing to go back to
            old = [ShardStateSet(s) for s in await self._states()]
        timeout = self.config.worker_timeout
        await load_all_or_none(self.refs, states, old, timeout, "shard")
        self.steps = int(ckpt.step)
        self._watch.clear(generation)
