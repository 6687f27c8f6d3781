"""`ShardGroup`: a tensor-parallel trainer's view of its shards, the fan-out
of each phase of a step over them (usable on its own, e.g. in tests)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from atomr.actor import ActorRef
from atomr.train.comm._fanout import (
    ask_all,
    ask_all_settled,
    failed_indices,
    first_failure,
    load_all_or_none,
    raise_first_failure,
)
from atomr.train.core.config import TrainerConfig
from atomr.train.tensor_parallel.messages import (
    LossResult,
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
    ShardSliceState,
)
from atomr.train.tensor_parallel.sharding import scatter_pieces

__all__ = ["ShardGroup", "ShardedGradients"]


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
        self, refs: Sequence[ActorRef], infos: Sequence[ShardInfo], timeout: float | None
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
    async def connect(cls, refs: Sequence[ActorRef], config: TrainerConfig) -> ShardGroup:
        """Describe, check and configure the shards.

        Args:
            refs: the shards, in rank order (their number is the shard count).
            config: the trainer's config (its optimizer and loss are sent on;
                its `worker_timeout` bounds every request).

        Returns:
            The group.

        Raises:
            ValueError: the shards disagree with each other (their model or
                its dtype), with their rank order, or with their number, or
                their parameters do not add up to the model's.
            TypeError: a shard does not answer `ShardDescribe` with a `ShardInfo`.
        """
        timeout = config.worker_timeout
        infos = await ask_all(refs, ShardDescribe(), timeout, per_worker=False)
        _check_infos(infos)
        message = ShardConfigure(config.optimizer, config.loss)
        await ask_all(refs, message, timeout, per_worker=False)
        return cls(refs, infos, timeout)

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
        """Run every backward stage, last to first (after a training `loss`).

        Args:
            input_grad: also assemble d(mean loss)/d(features).

        Returns:
            `(global gradient norm, input gradient or None)`.
        """
        last = self.stages - 1
        replies = await self._all(ShardBackward(last, (), input_grad and last == 0))
        return await self._down(last, replies, input_grad, apply=False)

    async def loss_and_backward(
        self,
        outputs: Sequence[np.ndarray],
        y: np.ndarray,
        *,
        input_grad: bool = False,
        apply: bool = False,
    ) -> tuple[LossResult, float, np.ndarray | None]:
        """A training `loss` then `backward`, in one message round fewer:
        the last stage's backward goes with the loss (`ShardLoss.backward`;
        shards that answer a plain `LossResult` are sent it on its own).

        Args:
            outputs, y: as for `loss`.
            input_grad: as for `backward`.
            apply: stage 0 also applies each shard's optimizer, unscaled and
                unconfirmed (`ShardBackward.apply`): `apply(1.0)` then
                confirms it without device work. For a caller that does not
                clip; a shard whose squared norm is not finite applies
                nothing, and any message but `ShardApply` undoes the update.

        Returns:
            `(shard 0's LossResult, global gradient norm, input gradient or None)`.

        Raises:
            Exception: the first failing shard's own exception.
        """
        last = self.stages - 1
        first = ShardBackward(last, (), input_grad and last == 0, apply and last == 0)
        replies = await self._all(ShardLoss(tuple(outputs), y, True, first))
        result = replies[0] if isinstance(replies[0], LossResult) else replies[0].loss
        plain = [i for i, r in enumerate(replies) if isinstance(r, LossResult)]
        if plain:  # shards that predate `ShardLoss.backward`: the backward on its own
            refs = [self.refs[i] for i in plain]
            late = await ask_all_settled(refs, first, self.timeout, per_worker=False)
            settled: list[Any] = [None] * len(replies)
            for i, reply in zip(plain, late, strict=True):
                settled[i] = replies[i] = reply
            raise_first_failure(settled)
        norm, dx = await self._down(last, replies, input_grad, apply)
        return result, norm, dx

    async def _down(
        self, stage: int, replies: list[Any], input_grad: bool, apply: bool
    ) -> tuple[float, np.ndarray | None]:
        """The backward stages below `stage`, given its replies; `(norm, dx)` as `backward`."""
        for below in range(stage - 1, -1, -1):
            grads = tuple(r.partial for r in replies)
            message = ShardBackward(below, grads, input_grad and below == 0, apply and below == 0)
            replies = await self._all(message)
        norm = math.sqrt(sum(float(r.sq_norm) for r in replies))
        dx = None
        if input_grad:
            ranges = [info.in_range for info in self.infos]
            dx = _assemble([r.partial for r in replies], ranges, self.sizes[0])
        return norm, dx

    async def apply(self, scale: float) -> None:
        """Phase 2: every shard applies its optimizer; all or none.

        Raises:
            Exception: the first failing shard's exception, after every shard
                was sent `ShardRollback`: any may have applied (one whose ask
                timed out applies later, its rollback queued behind; one whose
                actor raised may have raised after its swap), and one that
                did not apply answers it with an error that changes nothing.
                A shard that answered its apply and then failed to roll back
                is named in a note.
        """
        results = await ask_all_settled(
            self.refs, ShardApply(scale), self.timeout, per_worker=False
        )
        if not failed_indices(results):
            return
        rolled = await ask_all_settled(self.refs, ShardRollback(), self.timeout, per_worker=False)
        error = first_failure(results)
        assert error is not None
        stuck = [i for i in failed_indices(rolled) if results[i] is None]
        if stuck:
            error.add_note(
                f"shards {stuck} applied but failed to roll back: the model is inconsistent, "
                "load a checkpoint"
            )
        raise error

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
        states: list[ShardSliceState] = await self._all(ShardGetState())
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
        old = ShardSetState(*await self.state()) if keep_old else None
        n = len(self.refs)
        message = ShardSetState(weights, optimizer, int(step))
        restore = None if old is None else [old] * n
        await load_all_or_none(self.refs, [message] * n, restore, self.timeout, "shard")

    async def gradients(self, x: np.ndarray, y: np.ndarray) -> ShardedGradients:
        """Phase 1 only, returning everything: output, loss, input and weight
        gradients. Changes no weight.

        Args:
            x, y: a batch validated for the model and loss.

        Returns:
            `ShardedGradients`.
        """
        outs = await self.forward(x, train=True)
        result, norm, dx = await self.loss_and_backward(outs, y, input_grad=True)
        assert dx is not None
        grads = await self.gather("grads")
        ranges = [info.output_range for info in self.infos]
        output = _assemble(outs, ranges, self.sizes[-1])
        return ShardedGradients(output, result.loss_sum / result.normaliser, norm, dx, grads)


def _check_infos(infos: Sequence[Any]) -> None:
    """Check the shards' `ShardInfo`s: rank order, one shard count, one model
    in one dtype, and parameters that add up to the model's.

    Raises:
        TypeError: an answer is not a `ShardInfo`.
        ValueError: the shards disagree (the message names the first).
    """
    n = len(infos)
    for rank, info in enumerate(infos):
        if not isinstance(info, ShardInfo):
            raise TypeError(f"shard {rank} answered ShardDescribe with {type(info).__name__}")
        if info.rank != rank:
            raise ValueError(f"shard at position {rank} says it has rank {info.rank}")
        if info.shard_count != n:
            raise ValueError(
                f"shard {rank} was built for {info.shard_count} shards; {n} were given"
            )
        if _model_of(info) != _model_of(infos[0]):
            raise ValueError(f"shard {rank} holds another model than shard 0")
        dtype, first = info.model.get("dtype"), infos[0].model.get("dtype")
        if dtype != first:  # one model computes in one dtype; its slices would be rounded
            raise ValueError(f"shard {rank} computes in {dtype}, shard 0 in {first}")
    owned = sum(info.n_params for info in infos)
    if owned != infos[0].total_params:
        raise ValueError(
            f"the shards own {owned} parameters, the model has {infos[0].total_params}"
        )


def _model_of(info: ShardInfo) -> tuple[Any, ...]:
    """What every shard of one model agrees on."""
    return (info.sizes, info.model.get("activation"), info.total_params, info.stages)


def _merge_states(
    total: int, states: Sequence[ShardSliceState]
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
