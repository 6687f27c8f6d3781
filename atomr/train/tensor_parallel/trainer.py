"""`TensorParallelTrainer`: each layer's weights split across shard actors.

The trainer splits the input, asks every shard, and routes the partial
outputs: each shard receives all partials of a stage and sums them itself
(an all-reduce whose arithmetic runs on the shards' devices). The built-in
`ShardActor` implements Megatron-LM's column-parallel / row-parallel pair
(see `atomr.train.tensor_parallel.sharding` and docs/tensor_parallel.md); any actor that
answers `ShardProtocol` (`atomr.train.tensor_parallel.shard`) can be a shard.

A `Step` is atomic. Phase 1 (forward stages, loss, backward stages) writes
only the shards' gradients; if any shard fails, the step is abandoned and no
weight changes. Phase 2 asks every shard to apply its optimizer to its slice
(each snapshots first); if one fails, the shards that applied roll back. The
asker sees the failing shard's own exception type.

A shard actor that raises (rather than answering `Failure`) is resumed: its
state is still valid, since its updates are atomic. Only a `ContextPoisoned`
restarts it, with its initial slice and no optimizer state; the trainer
keeps no copy to restore it from, so it then answers every request with
`WorkerStateLost` until a `LoadCheckpoint` succeeds (`recovery.StateLossWatch`).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from atomr.accel import Device
from atomr.actor import Actor, ActorRef, AskTimeoutError, Failure, OneForOneStrategy, Props
from atomr.actor.supervision import SupervisorStrategy
from atomr.train._fanout import ask_all, ask_all_settled, failed_indices, raise_first_failure
from atomr.train._recovery import StateLossWatch
from atomr.train.core.checkpoint import (
    Checkpoint,
    CheckpointError,
    check_model_matches,
    load_checkpoint,
    save_checkpoint,
)
from atomr.train.core.config import TrainerConfig, check_update_rule
from atomr.train.core.loss import LossKind
from atomr.train.core.messages import Evaluate, GetWeights, LoadCheckpoint, SaveCheckpoint, Step
from atomr.train.core.mlp import Mlp
from atomr.train.core.optimizer import OptimizerKind
from atomr.train.core.stats import EvalResult, StepStats
from atomr.train.core.step_checks import check_gradient
from atomr.train.core.validation import validate_batch
from atomr.train.tensor_parallel.shard import (
    LossResult,
    ShardActor,
    ShardApply,
    ShardBackward,
    ShardConfigure,
    ShardDescribe,
    ShardForward,
    ShardGather,
    ShardGetState,
    ShardInfo,
    ShardLoss,
    ShardRollback,
    ShardSetState,
    ShardState,
)
from atomr.train.tensor_parallel.sharding import check_shardable, scatter_pieces

__all__ = [
    "ShardGroup",
    "ShardedGradients",
    "TensorParallelConfig",
    "TensorParallelTrainer",
]


@dataclass(frozen=True)
class TensorParallelConfig:
    """What a `TensorParallelTrainer` needs besides its shards.

    Attributes:
        shard_count: the number of shards N (>= 1); it must equal the number
            of shards (or devices) given, and every shard's own count.
        optimizer: the update rule, applied by each shard to its slice.
        loss: the loss (default cross-entropy).
        gradient_clip: clip to this global L2 norm (over all shards) before
            the optimizer step, or None.
        ask_timeout: seconds each request to a shard may take.

    Raises:
        TypeError: `optimizer` or `loss` of the wrong type.
        ValueError: `shard_count < 1`, or a non-positive clip or timeout.
    """

    shard_count: int
    optimizer: OptimizerKind
    loss: LossKind = LossKind.CROSS_ENTROPY
    gradient_clip: float | None = None
    ask_timeout: float = 60.0

    def __post_init__(self) -> None:
        n = self.shard_count
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"shard_count must be an int >= 1, got {n!r}")
        check_update_rule(self.optimizer, self.loss, self.gradient_clip)
        if not self.ask_timeout > 0:
            raise ValueError(f"ask_timeout must be > 0, got {self.ask_timeout}")

    def trainer_config(self) -> TrainerConfig:
        """The equivalent single-device `TrainerConfig` (the reference to compare with)."""
        return TrainerConfig(self.optimizer, self.loss, self.gradient_clip)


@dataclass(frozen=True, eq=False)
class ShardedGradients:
    """Result of `ShardGroup.gradients`: the sharded model's output and gradients.

    Attributes:
        output: the full model output `(batch, out_width)`.
        loss: the mean loss.
        grad_norm: the global gradient norm.
        input_grad: d(mean loss)/d(features), `(batch, in_width)`.
        grads: the full flat gradient vector (`Mlp.params` layout).
    """

    output: np.ndarray
    loss: float
    grad_norm: float
    input_grad: np.ndarray
    grads: np.ndarray


def _assemble(
    parts: Sequence[np.ndarray], ranges: Sequence[tuple[int, int]], width: int
) -> np.ndarray:
    """Place (and sum where ranges overlap) column blocks into one array."""
    first = np.asarray(parts[0])
    out = np.zeros((first.shape[0], width), dtype=np.float64)
    for part, (lo, hi) in zip(parts, ranges, strict=True):
        out[:, lo:hi] += part
    return out.astype(first.dtype)


class ShardGroup:
    """The trainer's view of its shards: checked descriptions plus the
    fan-out of each phase of a step (usable on its own, e.g. in tests).

    Build one with `await ShardGroup.connect(refs, config)`.

    Attributes:
        refs: the shards, in rank order.
        infos: their `ShardInfo`s.
        timeout: seconds per request.
    """

    def __init__(
        self, refs: Sequence[ActorRef], infos: Sequence[ShardInfo], timeout: float
    ) -> None:
        self.refs = list(refs)
        self.infos = list(infos)
        self.timeout = timeout
        first = self.infos[0]
        self.model: dict[str, Any] = first.model
        self.sizes = tuple(first.sizes)
        self.total_params = first.total_params
        self.stages = first.stages
        self.dtype = np.dtype(str(first.model.get("dtype", "float32")))

    @classmethod
    async def connect(cls, refs: Sequence[ActorRef], config: TensorParallelConfig) -> ShardGroup:
        """Describe, check and configure the shards.

        Args:
            refs: the shards, in rank order.
            config: the trainer's config (its optimizer and loss are sent on).

        Returns:
            The group.

        Raises:
            ValueError: the shards disagree with each other, with their rank
                order, or with `config.shard_count`, or their parameters do
                not add up to the model's.
            TypeError: a shard does not answer `ShardDescribe` with a `ShardInfo`.
        """
        n = len(refs)
        if n != config.shard_count:
            raise ValueError(
                f"config.shard_count is {config.shard_count} but {n} shards were given"
            )
        infos = await ask_all(refs, ShardDescribe(), config.ask_timeout, per_worker=False)
        for rank, info in enumerate(infos):
            if not isinstance(info, ShardInfo):
                raise TypeError(f"shard {rank} answered ShardDescribe with {type(info).__name__}")
            if info.rank != rank:
                raise ValueError(f"shard at position {rank} says it has rank {info.rank}")
            if info.shard_count != n:
                raise ValueError(
                    f"shard {rank} was built for {info.shard_count} shards; "
                    f"config.shard_count is {n}"
                )
            first = infos[0]
            same = (info.sizes, info.model.get("activation"), info.total_params, info.stages)
            if same != (
                first.sizes,
                first.model.get("activation"),
                first.total_params,
                first.stages,
            ):
                raise ValueError(f"shard {rank} holds another model than shard 0")
        owned = sum(info.n_params for info in infos)
        if owned != infos[0].total_params:
            raise ValueError(
                f"the shards own {owned} parameters, the model has {infos[0].total_params}"
            )
        await ask_all(
            refs,
            ShardConfigure(config.optimizer, config.loss),
            config.ask_timeout,
            per_worker=False,
        )
        return cls(refs, infos, config.ask_timeout)

    async def _all(self, message: Any) -> list[Any]:
        return await ask_all(self.refs, message, self.timeout, per_worker=False)

    async def forward(self, x: np.ndarray, train: bool) -> list[np.ndarray]:
        """Run every forward stage.

        Args:
            x: validated features `(batch, in_width)`.
            train: keep what the backward needs.

        Returns:
            Every shard's last-stage reply, in rank order.

        Raises:
            Exception: the first failing shard's own exception.
        """
        inputs = []
        for info in self.infos:
            lo, hi = info.in_range
            inputs.append(x if (lo, hi) == (0, x.shape[1]) else np.ascontiguousarray(x[:, lo:hi]))
        outs = await ask_all(
            self.refs, [ShardForward(0, (xi,), train) for xi in inputs], self.timeout
        )
        for stage in range(1, self.stages):
            outs = await self._all(ShardForward(stage, tuple(outs), train))
        return outs

    async def loss(self, outputs: Sequence[np.ndarray], y: np.ndarray, train: bool) -> LossResult:
        """Compute the loss on the combined output.

        With `train`, every shard computes it (each keeps the output gradient
        for its backward); without, shard 0 alone does.

        Returns:
            Shard 0's `LossResult`.
        """
        message = ShardLoss(tuple(outputs), y, train)
        if train:
            results = await self._all(message)
        else:
            results = [await self.refs[0].ask(message, timeout=self.timeout)]
        return results[0]

    async def backward(self, input_grad: bool = False) -> tuple[float, np.ndarray | None]:
        """Run every backward stage, last to first.

        Args:
            input_grad: also assemble d(mean loss)/d(features).

        Returns:
            `(global gradient norm, input gradient or None)`.
        """
        grads: tuple[np.ndarray, ...] = ()
        replies: list[Any] = []
        for stage in range(self.stages - 1, -1, -1):
            replies = await self._all(ShardBackward(stage, grads, input_grad and stage == 0))
            if stage > 0:
                grads = tuple(r.partial for r in replies)
        norm = math.sqrt(sum(float(r.sq_norm) for r in replies))
        dx = None
        if input_grad:
            ranges = [info.in_range for info in self.infos]
            dx = _assemble([r.partial for r in replies], ranges, self.sizes[0])
        return norm, dx

    async def apply(self, scale: float) -> None:
        """Phase 2: every shard applies its optimizer; all or none.

        Raises:
            Exception: the first failing shard's exception, after the shards
                that applied have rolled back. A shard whose ask timed out
                may still apply later: it is sent `ShardRollback` too (the
                rollback is queued behind its apply).
        """
        kwargs = {"timeout": self.timeout}
        results = await asyncio.gather(
            *(ref.ask(ShardApply(scale), **kwargs) for ref in self.refs), return_exceptions=True
        )
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            done = [
                ref
                for ref, r in zip(self.refs, results, strict=True)
                if r is None or isinstance(r, AskTimeoutError)
            ]
            rolled = await asyncio.gather(
                *(ref.ask(ShardRollback(), **kwargs) for ref in done), return_exceptions=True
            )
            for r in rolled:
                if isinstance(r, BaseException):
                    r.add_note("rolling back after a failed apply also failed")
            raise_first_failure(list(results))

    async def gather(self, what: str = "params") -> np.ndarray:
        """The full flat parameters ("params") or gradients ("grads")."""
        slices = await self._all(ShardGather(what))
        pieces = [(s.index, s.values) for s in slices]
        return await asyncio.to_thread(scatter_pieces, self.total_params, pieces)

    async def state(self) -> tuple[np.ndarray, dict[str, Any], int]:
        """The full weights, full-vector optimizer state and step count.

        Raises:
            ValueError: the shards' slices do not partition the model, or
                they disagree about the step count or optimizer.
        """
        states: list[ShardState] = await self._all(ShardGetState())
        return await asyncio.to_thread(_merge_states, self.total_params, states)

    async def load(
        self,
        weights: np.ndarray,
        optimizer: dict[str, Any],
        step: int,
        *,
        keep_old: bool = True,
    ) -> None:
        """Give every shard its slice of full-vector state; all or none.

        Args:
            weights, optimizer, step: the full flat weights, the full-vector
                optimizer `state_dict()` and the step count (a checkpoint's).
            keep_old: gather the shards' state first (`state`) and, if a shard
                fails to load, give every shard its old slice back. Off when
                the old state is already lost (a restarted shard).

        Raises:
            Exception: the first failing shard's own exception (`worker_index`
                set to its rank, a note naming it), after every shard holds
                its state from before the load again (with `keep_old`). A
                shard whose ask timed out may still load later: its restore
                waits in its mailbox behind that load.
        """
        old = await self.state() if keep_old else None
        results = await ask_all_settled(
            self.refs, ShardSetState(weights, optimizer, int(step)), self.timeout, per_worker=False
        )
        failed = failed_indices(results)
        if not failed:
            return
        rank = failed[0]
        error: BaseException = results[rank]
        error.worker_index = rank  # type: ignore[attr-defined]
        if old is None:
            error.add_note(f"shard {rank} failed to load the checkpoint")
            raise error
        restored = await ask_all_settled(
            self.refs, ShardSetState(*old), self.timeout, per_worker=False
        )
        unrestored = failed_indices(restored)
        if unrestored:
            error.add_note(
                f"shard {rank} failed to load the checkpoint, and giving the shards back their "
                f"old state failed on shards {unrestored}: the model is inconsistent, load a "
                "checkpoint"
            )
        else:
            error.add_note(
                f"shard {rank} failed to load the checkpoint; every shard was given back its "
                "state from before the load"
            )
        raise error

    async def gradients(self, x: np.ndarray, y: np.ndarray) -> ShardedGradients:
        """Phase 1 only, returning everything: output, loss, input and weight
        gradients. Changes no weight.

        Args:
            x, y: a batch validated for the model and loss.

        Returns:
            `ShardedGradients`.
        """
        outs = await self.forward(x, train=True)
        result = await self.loss(outs, y, train=True)
        norm, dx = await self.backward(input_grad=True)
        assert dx is not None
        grads = await self.gather("grads")
        ranges = [info.output_range for info in self.infos]
        output = _assemble(outs, ranges, self.sizes[-1])
        return ShardedGradients(output, result.loss_sum / result.normaliser, norm, dx, grads)


def _merge_states(
    total: int, states: Sequence[ShardState]
) -> tuple[np.ndarray, dict[str, Any], int]:
    weights = scatter_pieces(total, [(s.index, s.params) for s in states])
    steps = {int(s.step) for s in states}
    if len(steps) != 1:
        raise ValueError(f"the shards disagree about the step count: {sorted(steps)}")
    first = states[0].optimizer
    optimizer: dict[str, Any] = {}
    for key, value in first.items():
        if isinstance(value, np.ndarray):
            optimizer[key] = scatter_pieces(total, [(s.index, s.optimizer[key]) for s in states])
        else:
            optimizer[key] = value
    return weights, optimizer, steps.pop()


class TensorParallelTrainer(Actor):
    """Trains an `Mlp` whose layers are split across N shard actors.

    Answers `Step -> StepStats`, `GetWeights -> ndarray` (the full flat
    vector), `Evaluate -> EvalResult`, `SaveCheckpoint -> None` and
    `LoadCheckpoint -> None`, like `Trainer`, with the same results (float32
    tolerance) and interchangeable checkpoints. Every error is answered with
    `Failure(exc)`: bad input, a failing shard (its own exception type) or a
    bad checkpoint; nothing changes then.

    Args:
        config: shard count, optimizer, loss, clipping.
        shards: `config.shard_count` shard `ActorRef`s answering
            `ShardProtocol`, in rank order, or `Props` of shards, which the
            trainer spawns as its children ("shard-0", ...).

    Raises:
        TypeError: `config` is not a `TensorParallelConfig`, or a shard is
            neither an `ActorRef` nor a `Props` (or the two are mixed).
        ValueError: the number of shards differs from `config.shard_count`.
    """

    def __init__(self, config: TensorParallelConfig, shards: Sequence[ActorRef | Props]) -> None:
        super().__init__()
        _check_shards(config, shards)
        self.config = config
        self._shards = list(shards)
        self._group: ShardGroup | None = None
        self._watch = StateLossWatch("shard")
        self.steps = 0

    @classmethod
    def props(cls, config: TensorParallelConfig, shards: Sequence[ActorRef | Props]) -> Props:
        """The `Props` of a trainer over existing shards (or shard `Props`).

        Raises:
            TypeError, ValueError: as the class (checked here, before spawning).
        """
        _check_shards(config, shards)
        return Props(cls, config, list(shards))

    @classmethod
    async def spawn(
        cls,
        system: Any,
        model: Mlp,
        devices: Sequence[Device | str],
        config: TensorParallelConfig,
        name: str | None = None,
    ) -> ActorRef:
        """Spawn a trainer with one built-in `ShardActor` per device, and wait
        until every shard holds its slice.

        Args:
            system: the `ActorSystem` (or a `Context`) to spawn in.
            model: the model to split (not modified).
            devices: one device per shard, `len(devices) == config.shard_count`.
            config: as for the class.
            name: the trainer's name, or None.

        Returns:
            The trainer's `ActorRef`.

        Raises:
            TypeError: `model` or `config` of the wrong type.
            ValueError: `len(devices) != config.shard_count`, a layer width
                smaller than the shard count, a model with `activate_last`,
                or a bad device name.
        """
        if not isinstance(model, Mlp):
            raise TypeError(f"model must be an Mlp, got {type(model).__name__}")
        if not isinstance(config, TensorParallelConfig):
            raise TypeError(f"config must be a TensorParallelConfig, got {type(config).__name__}")
        devs = [Device.parse(d) for d in devices]
        if len(devs) != config.shard_count:
            raise ValueError(
                f"config.shard_count is {config.shard_count} but {len(devs)} devices were given"
            )
        if model.activate_last:
            raise ValueError("tensor parallelism does not support models with activate_last")
        check_shardable(model.sizes, config.shard_count)
        n = config.shard_count
        shard_props = [ShardActor.props(model, rank, n, dev) for rank, dev in enumerate(devs)]
        ref: ActorRef = system.spawn(cls.props(config, shard_props), name=name)
        await ref.ask(GetWeights(), timeout=config.ask_timeout)
        return ref

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
        if isinstance(message, Step):
            return await self._step(group, message)
        if isinstance(message, Evaluate):
            return await self._evaluate(group, message)
        if isinstance(message, GetWeights):
            return await group.gather("params")
        if isinstance(message, SaveCheckpoint):
            return await self._save(group, message)
        if isinstance(message, LoadCheckpoint):
            return await self._load(group, message)
        return Failure(TypeError(f"TensorParallelTrainer does not handle {type(message).__name__}"))

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
        result = await group.loss(outs, y, train=True)
        grad_norm, _ = await group.backward()
        check_gradient(grad_norm)
        scale = 1.0
        clip = self.config.gradient_clip
        if clip is not None:
            scale = min(1.0, clip / (grad_norm + 1e-6))
        # phase 2: apply everywhere, or nowhere
        await group.apply(scale)
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
        return EvalResult(result.loss_sum / result.normaliser, accuracy, x.shape[0])

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
        ckpt = await asyncio.to_thread(load_checkpoint, message.path)
        check_model_matches(ckpt, group.model, group.total_params)
        state = ckpt.optimizer
        try:
            kind = OptimizerKind.from_config(state["kind"])
            step = int(state["step"])
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"checkpoint optimizer state does not fit: {exc}") from exc
        if kind.name != self.config.optimizer.name:
            raise CheckpointError(
                f"checkpoint optimizer is {kind.name!r}, this trainer uses "
                f"{self.config.optimizer.name!r}"
            )
        for key, value in state.items():
            if isinstance(value, np.ndarray) and value.shape != (group.total_params,):
                raise CheckpointError(
                    f"optimizer buffer {key!r} has shape {value.shape}, "
                    f"expected ({group.total_params},)"
                )
        if int(ckpt.extra.get("micro", 0)) > 0:
            raise CheckpointError(
                "checkpoint is in the middle of a gradient accumulation; "
                "the tensor-parallel trainer does not accumulate"
            )
        await group.load(ckpt.weights, state, step, keep_old=keep_old)
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


def _check_shards(config: Any, shards: Sequence[Any]) -> None:
    if not isinstance(config, TensorParallelConfig):
        raise TypeError(f"config must be a TensorParallelConfig, got {type(config).__name__}")
    items = list(shards)
    if len(items) != config.shard_count:
        raise ValueError(
            f"config.shard_count is {config.shard_count} but {len(items)} shards were given"
        )
    if all(isinstance(s, ActorRef) for s in items) or all(isinstance(s, Props) for s in items):
        return
    raise TypeError("shards must all be ActorRefs or all be Props")
