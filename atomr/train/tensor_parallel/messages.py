"""The shard protocol: the messages a `TensorParallelTrainer` sends its
shards, and `ShardProtocol`, which lists them with their replies.

Bring your own shard actor by answering them (see `ShardProtocol`); the
built-in one is `ShardActor`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from atomr.train.core.loss import LossKind
from atomr.train.core.messages import SetLearningRate
from atomr.train.core.optimizer import OptimizerKind

__all__ = [
    "LossResult",
    "ShardApply",
    "ShardBackward",
    "ShardConfigure",
    "ShardDescribe",
    "ShardForward",
    "ShardGather",
    "ShardGetState",
    "ShardGrad",
    "ShardInfo",
    "ShardLoss",
    "ShardProtocol",
    "ShardRollback",
    "ShardSetState",
    "ShardSlice",
    "ShardSliceState",
]


@dataclass(frozen=True, slots=True)
class ShardDescribe:
    """Ask a shard to describe itself; answered with `ShardInfo`."""


@dataclass(frozen=True, slots=True)
class ShardInfo:
    """What a shard tells its trainer.

    Attributes:
        rank: the shard's position, 0-based.
        shard_count: how many shards the model is split over.
        model: the model's `Mlp.config()` (checkpoints record it).
        sizes: the model's widths.
        total_params: the model's parameter count.
        n_params: the parameters this shard owns.
        stages: forward rounds of a step.
        in_range: the input features `lo:hi` this shard reads.
        output_range: the output columns its last-stage reply covers (summed
            with the other shards' replies where ranges overlap).
    """

    rank: int
    shard_count: int
    model: dict[str, Any]
    sizes: tuple[int, ...]
    total_params: int
    n_params: int
    stages: int
    in_range: tuple[int, int]
    output_range: tuple[int, int]


@dataclass(frozen=True, slots=True)
class ShardConfigure:
    """Set the update rule and loss; answered with None.

    Attributes:
        optimizer: the rule for the shard's slice (fresh state unless the
            shard already has state for this same rule).
        loss: the loss kind `ShardLoss` computes.
    """

    optimizer: OptimizerKind
    loss: LossKind


@dataclass(frozen=True, eq=False)
class ShardForward:
    """Run one forward stage; answered with the shard's output array (host).

    Attributes:
        stage: 0-based stage.
        inputs: stage 0: `(features[:, in_range],)`; later stages: every
            shard's reply to the previous stage, in rank order.
        train: keep what the backward pass needs (a new step begins at
            stage 0 with `train`).
    """

    stage: int
    inputs: tuple[np.ndarray, ...]
    train: bool = True


@dataclass(frozen=True, eq=False)
class ShardLoss:
    """Combine the last stage's outputs and compute the loss; answered with
    `LossResult`, or with `backward` set, with that backward's `ShardGrad`
    carrying the `LossResult` as its `loss`.

    Attributes:
        outputs: every shard's last-stage reply, in rank order.
        labels: validated labels or targets (`validate_batch`).
        train: keep d(mean loss)/d(output) for `ShardBackward`.
        backward: None, or (with `train`) the last stage's `ShardBackward`,
            run in the same request: one message round fewer per step. A
            shard that answers a plain `LossResult` (one that does not know
            this field) is then sent the `ShardBackward` on its own.
    """

    outputs: tuple[np.ndarray, ...]
    labels: np.ndarray
    train: bool = True
    backward: ShardBackward | None = None


@dataclass(frozen=True, slots=True)
class LossResult:
    """The loss of a batch, as a sum and a normaliser (mean = sum / normaliser).

    Attributes:
        loss_sum: the loss sum.
        normaliser: element count (MSE), sample count or weight sum (CE).
        correct: samples whose arg-max output equals the label (classification
            with `train=False`), else -1.
    """

    loss_sum: float
    normaliser: float
    correct: int = -1


@dataclass(frozen=True, eq=False)
class ShardBackward:
    """Run one backward stage; answered with `ShardGrad`.

    Attributes:
        stage: 0-based stage, run from the last down to 0.
        grads: `()` for the last stage; otherwise every shard's partial input
            gradient from stage + 1, in rank order.
        input_grad: at stage 0, also return the partial gradient of the input.
        apply: at stage 0 only: then also apply the optimizer, unscaled, as
            `ShardApply(1.0)` would (not when the shard's own squared norm
            is not finite), saving a message round when the trainer does
            not clip. The update is unconfirmed: `ShardApply(1.0)` confirms
            it without device work (a smaller scale undoes it and applies
            scaled), `ShardRollback` undoes it, and any other message undoes
            it first (the step it belonged to failed).
    """

    stage: int
    grads: tuple[np.ndarray, ...] = ()
    input_grad: bool = False
    apply: bool = False


@dataclass(frozen=True, eq=False)
class ShardGrad:
    """A backward stage's reply.

    Attributes:
        partial: this shard's partial gradient of the stage's input (summed over
            shards where their `in_range`s overlap), or None.
        sq_norm: at stage 0, the squared L2 norm of all the shard's gradients
            (each parameter is owned by one shard, so the sum over shards is
            the squared global norm); else None.
        loss: the `LossResult` of a `ShardLoss` that carried this backward,
            else None.
    """

    partial: np.ndarray | None
    sq_norm: float | None = None
    loss: LossResult | None = None


@dataclass(frozen=True, slots=True)
class ShardApply:
    """Apply the optimizer to the gradients of the last backward; answered with None.

    Attributes:
        scale: the global clipping factor; the gradients are scaled by it
            when it is below 1.
    """

    scale: float = 1.0


@dataclass(frozen=True, slots=True)
class ShardRollback:
    """Restore the weights and optimizer state from before the last `ShardApply`."""


@dataclass(frozen=True, slots=True)
class ShardGather:
    """Ask for the shard's slice of the flat parameters or gradients; answered
    with `ShardSlice`.

    Attributes:
        what: "params" or "grads".
    """

    what: str = "params"


@dataclass(frozen=True, eq=False)
class ShardSlice:
    """A shard's values and their positions in the model's flat vector.

    Attributes:
        index: int64 positions.
        values: the values (host copy).
    """

    index: np.ndarray
    values: np.ndarray


@dataclass(frozen=True, slots=True)
class ShardGetState:
    """Ask for everything a checkpoint needs from the shard; answered with `ShardSliceState`."""


@dataclass(frozen=True, eq=False)
class ShardSliceState:
    """A shard's checkpointable state.

    Attributes:
        index: int64 positions of its parameters in the flat vector.
        params: their values.
        optimizer: the slice's optimizer `state_dict()` (buffers in `index` order).
        step: optimizer steps applied.
    """

    index: np.ndarray
    params: np.ndarray
    optimizer: dict[str, Any]
    step: int


@dataclass(frozen=True, eq=False)
class ShardSetState:
    """Load full-vector state (a checkpoint); each shard takes its slice. Answered with None.

    Attributes:
        params: the full flat parameter vector.
        optimizer: a full-vector optimizer `state_dict()`.
        step: the step count.
    """

    params: np.ndarray
    optimizer: dict[str, Any]
    step: int


class ShardProtocol:
    """The messages a tensor-parallel shard actor answers (bring your own shard).

    The trainer only routes arrays between shards; every piece of math
    (including the all-reduce sums, which each shard performs on its own
    device over the same inputs, in rank order, so all shards hold
    bit-identical results) runs on the shards.

    | message | reply | meaning |
    |---|---|---|
    | `ShardDescribe()` | `ShardInfo` | rank, shard count, model config, sizes, stage count |
    | `ShardConfigure(optimizer, loss)` | `None` | the update rule and loss (optimizer state is kept when the rule is unchanged) |
    | `ShardForward(stage, inputs, train)` | `ndarray` | stage 0: `inputs = (x[:, in_range],)`; stage k > 0: every shard's stage k-1 reply, in rank order; returns this shard's partial output (or output slice) |
    | `ShardLoss(outputs, labels, train, backward)` | `LossResult`; with `backward`, `ShardGrad` | `outputs`: every shard's last-stage reply; combine, compute the loss sum and normaliser; with `train`, keep d(mean loss)/d(output) for the backward; with `backward` (the last stage's `ShardBackward`), run it too and answer its `ShardGrad` with `loss` set |
    | `ShardBackward(stage, grads, input_grad, apply)` | `ShardGrad` | the last stage takes `grads = ()` (it starts from the loss); stage k < last takes every shard's stage k+1 reply partials; writes this shard's gradients and returns its partial input gradient (None for stage 0 unless `input_grad`); stage 0 also returns the squared norm of the shard's gradients, and with `apply` applies the optimizer unscaled, unconfirmed (see `ShardBackward`) |
    | `ShardApply(scale)` | `None` | scale the gradients by `scale` when it is below 1, optimizer step out of place, swapped in (the old state kept for `ShardRollback`); a failure changes no weights; confirms an unconfirmed update when `scale` is 1 |
    | `ShardRollback()` | `None` | undo the last `ShardApply` (another shard's apply failed), or an unconfirmed update |
    | `ShardGather(what)` | `ShardSlice` | `what` = "params" or "grads": the positions in the full flat vector and their values |
    | `ShardGetState()` | `ShardSliceState` | positions, parameters, optimizer `state_dict()` of the slice, step count |
    | `ShardSetState(params, optimizer, step)` | `None` | take this shard's slice of full vectors (a checkpoint) |
    | `SetLearningRate(lr)` | `float`: the rate it replaces (given back if another worker fails) | the optimizer's learning rate |

    Rules a shard keeps: errors are answered with `Failure(exc)`; a shard is
    never restarted by a bad request, because its weights are one part of a
    distributed state that a restart would reset. Phase-1 messages
    (`ShardForward`, `ShardLoss`, `ShardBackward`) never touch the weights,
    but for `ShardBackward(apply=True)`, whose update stays unconfirmed
    (undone by the next message unless that confirms it). A shard that
    ignores the newer fields (`ShardLoss.backward`, `ShardBackward.apply`)
    still works: it is sent the separate messages.

    The built-in shard is `ShardActor`.

    Attributes:
        messages: the message types above.
    """

    messages: ClassVar[tuple[type, ...]] = (
        ShardDescribe,
        ShardConfigure,
        ShardForward,
        ShardLoss,
        ShardBackward,
        ShardApply,
        ShardRollback,
        ShardGather,
        ShardGetState,
        ShardSetState,
        SetLearningRate,
    )
