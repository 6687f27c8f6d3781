"""`ShardActor` and `ShardProtocol`: one tensor-parallel shard of an `Mlp`.

`ShardProtocol` is the set of messages a `TensorParallelTrainer` sends its
shards; bring your own shard actor by answering them. The trainer only
routes arrays between shards; every piece of math (including the all-reduce
sums, which each shard performs on its own device over the same inputs, in
rank order, so all shards hold bit-identical results) runs on the shards.

| message | reply | meaning |
|---|---|---|
| `ShardDescribe()` | `ShardInfo` | rank, shard count, model config, sizes, stage count |
| `ShardConfigure(optimizer, loss)` | `None` | the update rule and loss (optimizer state is kept when the rule is unchanged) |
| `ShardForward(stage, inputs, train)` | `ndarray` | stage 0: `inputs = (x[:, in_range],)`; stage k > 0: every shard's stage k-1 reply, in rank order; returns this shard's partial output (or output slice) |
| `ShardLoss(outputs, labels, train)` | `LossResult` | `outputs`: every shard's last-stage reply; combine, compute the loss sum and normaliser; with `train`, keep d(mean loss)/d(output) for the backward |
| `ShardBackward(stage, grads, input_grad)` | `ShardGrad` | the last stage takes `grads = ()` (it starts from the loss); stage k < last takes every shard's stage k+1 reply partials; writes this shard's gradients and returns its partial input gradient (None for stage 0 unless `input_grad`); stage 0 also returns the squared norm of the shard's gradients |
| `ShardApply(scale)` | `None` | scale the gradients by `scale` when it is below 1, optimizer step out of place, swapped in (the old state kept for `ShardRollback`); a failure changes no weights |
| `ShardRollback()` | `None` | undo the last `ShardApply` (another shard's apply failed) |
| `ShardGather(what)` | `ShardSlice` | `what` = "params" or "grads": the positions in the full flat vector and their values |
| `ShardGetState()` | `ShardState` | positions, parameters, optimizer `state_dict()` of the slice, step count |
| `ShardSetState(params, optimizer, step)` | `None` | take this shard's slice of full vectors (a checkpoint) |

Errors are answered with `Failure(exc)`; a shard is never restarted by a bad
request, because its weights are one part of a distributed state that a
restart would reset. Phase-1 messages (`ShardForward`, `ShardLoss`,
`ShardBackward`) never touch the weights.

The built-in `ShardActor` implements the Megatron-LM column/row split of
`atomr.train.tensor_parallel.sharding`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from atomr.accel import Device, DeviceActor
from atomr.actor import Failure, Props
from atomr.train._recovery import DoubleBuffer
from atomr.train.core.device_guard import Rejected, guarded
from atomr.train.core.errors import CheckpointError
from atomr.train.core.loss import LossKind
from atomr.train.core.mlp import Mlp
from atomr.train.core.optimizer import Optimizer, OptimizerKind
from atomr.train.core.step_checks import check_loss, check_normaliser
from atomr.train.tensor_parallel.sharding import LayerShard, ShardLayout, shard_layout

__all__ = [
    "LossResult",
    "ShardActor",
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
    "ShardState",
]


# -- the protocol -------------------------------------------------------------


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
    """Combine the last stage's outputs and compute the loss; answered with `LossResult`.

    Attributes:
        outputs: every shard's last-stage reply, in rank order.
        labels: validated labels or targets (`validate_batch`).
        train: keep d(mean loss)/d(output) for `ShardBackward`.
    """

    outputs: tuple[np.ndarray, ...]
    labels: np.ndarray
    train: bool = True


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
    """

    stage: int
    grads: tuple[np.ndarray, ...] = ()
    input_grad: bool = False


@dataclass(frozen=True, eq=False)
class ShardGrad:
    """A backward stage's reply.

    Attributes:
        partial: this shard's partial gradient of the stage's input (summed over
            shards where their `in_range`s overlap), or None.
        sq_norm: at stage 0, the squared L2 norm of all the shard's gradients
            (each parameter is owned by one shard, so the sum over shards is
            the squared global norm); else None.
    """

    partial: np.ndarray | None
    sq_norm: float | None = None


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
    """Ask for everything a checkpoint needs from the shard; answered with `ShardState`."""


@dataclass(frozen=True, eq=False)
class ShardState:
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


ShardProtocol = (
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
)
"""The message types a tensor-parallel shard answers (see the module docstring)."""


# -- the built-in shard -------------------------------------------------------


@dataclass
class _StageTape:
    """What a stage's forward keeps for its backward."""

    pre_input: Any  # the combined pre-activation input (stage > 0), else None
    a_in: Any  # the column layer's input
    h: Any  # the column layer's output (pre-activation)
    a: Any = None  # the row layer's input (activation of h)


class ShardActor(DeviceActor):
    """One tensor-parallel shard of an `Mlp` on one device (see the module docstring).

    Owns the slice `shard_layout(model.sizes, shard_count, rank)` of the
    model's weights, its gradients and its optimizer state, and answers
    `ShardProtocol`. All math runs on the device's worker thread.

    Args:
        model: the full model; the shard copies its slice when it starts (the
            object is not modified).
        rank: this shard's position, `0 <= rank < shard_count`.
        shard_count: the number of shards.
        device: the shard's device (a `Device` or its name).

    Raises:
        TypeError: `model` is not an `Mlp`.
        ValueError: a sharded width is smaller than `shard_count`, bad rank,
            or a model with `activate_last` (not supported).
    """

    def __init__(self, model: Mlp, rank: int, shard_count: int, device: Device | str) -> None:
        super().__init__(device)
        if not isinstance(model, Mlp):
            raise TypeError(f"model must be an Mlp, got {type(model).__name__}")
        if model.activate_last:
            raise ValueError("tensor parallelism does not support models with activate_last")
        self.layout: ShardLayout = shard_layout(model.sizes, shard_count, rank)
        self._template = model
        self.activation = model.activation
        self.dtype = model.dtype
        self.params: Any = None
        self.grads: Any = None
        self.optimizer: Optimizer | None = None
        self.loss: LossKind | None = None
        self._tapes: list[_StageTape | None] = [None] * self.layout.stages
        self._batch = 0
        self._d_out: Any = None
        self._undo = DoubleBuffer()
        self._pending = False

    @classmethod
    def props(cls, model: Mlp, rank: int, shard_count: int, device: Device | str) -> Props:
        """The `Props` of a shard (arguments as for the class)."""
        return Props(cls, model, rank, shard_count, device)

    # -- set-up ---------------------------------------------------------------

    def _build(self) -> None:
        host = self._template.get_params()[self.layout.global_index()]
        be = self.backend
        self.params = be.to_device(np.ascontiguousarray(host, dtype=self.dtype))
        self.grads = be.zeros((self.layout.n_params,), dtype=self.dtype)

    def _w(self, buf: Any, ls: LayerShard) -> Any:
        return buf[ls.w_offset : ls.b_offset].reshape(ls.w_shape)

    def _b(self, buf: Any, ls: LayerShard) -> Any:
        return buf[ls.b_offset : ls.stop]

    def _dev(self, host: np.ndarray) -> Any:
        arr = np.ascontiguousarray(host, dtype=self.dtype)
        return self.backend.to_device(arr) if self.device.is_cuda else arr

    def _combine_sum(self, parts: tuple[np.ndarray, ...], width: int, what: str) -> Any:
        n = self.layout.shard_count
        if len(parts) != n:
            raise ValueError(
                f"{what}: expected {n} partial arrays (one per shard), got {len(parts)}"
            )
        for p in parts:
            if not isinstance(p, np.ndarray) or p.shape != (self._batch, width):
                raise ValueError(
                    f"{what}: each partial must be an ndarray of shape {(self._batch, width)}, "
                    f"got {getattr(p, 'shape', type(p).__name__)}"
                )
        out = self.backend.empty((self._batch, width), dtype=self.dtype)
        self.backend.sum_into(out, [self._dev(p) for p in parts])
        return out

    # -- phase 1: forward, loss, backward (weights untouched) -------------------

    def _forward(self, stage: int, inputs: tuple[np.ndarray, ...], train: bool) -> np.ndarray:
        be, lay, act = self.backend, self.layout, self.activation
        if not 0 <= stage < lay.stages:
            raise ValueError(f"stage must be in [0, {lay.stages}), got {stage}")
        layers = lay.stage_layers(stage)
        col = layers[0]
        if stage == 0:
            if len(inputs) != 1 or not isinstance(inputs[0], np.ndarray):
                raise ValueError("stage 0 takes one input array")
            x = inputs[0]
            if x.ndim != 2 or x.shape[1] != lay.sizes[0] or x.shape[0] < 1:
                raise ValueError(f"stage 0 input must be (batch, {lay.sizes[0]}), got {x.shape}")
            self._batch = x.shape[0]
            self._tapes = [None] * lay.stages
            self._d_out = None
            if train:
                self._pending = False
                self._undo.commit()
            pre_input, a_in = None, self._dev(x)
        else:
            if self._tapes[stage - 1] is None:
                raise ValueError(f"stage {stage} before stage {stage - 1}")
            u = self._combine_sum(inputs, col.w_shape[0], f"stage {stage} inputs")
            if act == "identity":
                pre_input, a_in = None, u
            else:
                pre_input, a_in = u, be.empty(u.shape, dtype=self.dtype)
                be.activation_forward(act, u, a_in)
        batch = self._batch
        h = be.empty((batch, col.w_shape[1]), dtype=self.dtype)
        be.matmul(a_in, self._w(self.params, col), h)
        be.bias_add(h, self._b(self.params, col))
        tape = _StageTape(pre_input, a_in, h)
        self._tapes[stage] = tape
        if col.gathered:
            return be.to_host(h)
        row = layers[1]
        if act == "identity":
            a = h
        else:
            a = be.empty(h.shape, dtype=self.dtype)
            be.activation_forward(act, h, a)
        tape.a = a
        part = be.empty((batch, row.w_shape[1]), dtype=self.dtype)
        be.matmul(a, self._w(self.params, row), part)
        if row.b_size:
            be.bias_add(part, self._b(self.params, row))
        return be.to_host(part)

    def _output(self, outputs: tuple[np.ndarray, ...]) -> Any:
        lay = self.layout
        out_width = lay.sizes[-1]
        if lay.layers[-1].gathered:
            if len(outputs) != lay.shard_count:
                raise ValueError(f"expected {lay.shard_count} output slices, got {len(outputs)}")
            full = np.concatenate([np.asarray(o, dtype=self.dtype) for o in outputs], axis=1)
            if full.shape != (self._batch, out_width):
                raise ValueError(
                    f"output slices make {full.shape}, expected {(self._batch, out_width)}"
                )
            return self._dev(full) if self.device.is_cuda else full
        return self._combine_sum(outputs, out_width, "outputs")

    def _loss(self, outputs: tuple[np.ndarray, ...], labels: np.ndarray, train: bool) -> LossResult:
        if self.loss is None:
            raise ValueError("shard has no loss: send ShardConfigure first")
        if self._tapes[-1] is None:
            raise ValueError("ShardLoss before the last forward stage")
        be = self.backend
        out = self._output(outputs)
        y = labels  # validated by the trainer (`validate_batch`)
        grad = be.empty(out.shape, dtype=self.dtype)
        loss_sum, norm = self.loss.sums(be, out, be.to_device(y), grad)
        check_loss(loss_sum)
        check_normaliser(norm)
        correct = -1
        if not train and self.loss.is_classification:
            correct = int(np.sum(np.argmax(be.to_host(out), axis=1) == y))
        if train:
            be.scale(grad, 1.0 / norm)
            self._d_out = grad
        return LossResult(float(loss_sum), float(norm), correct)

    def _backward(self, stage: int, grads: tuple[np.ndarray, ...], input_grad: bool) -> ShardGrad:
        be, lay, act = self.backend, self.layout, self.activation
        if not 0 <= stage < lay.stages:
            raise ValueError(f"stage must be in [0, {lay.stages}), got {stage}")
        tape = self._tapes[stage]
        if tape is None:
            raise ValueError(f"backward of stage {stage} before its forward")
        layers = lay.stage_layers(stage)
        col = layers[0]
        batch = self._batch
        if stage == lay.stages - 1:
            if grads:
                raise ValueError("the last stage's backward starts from the loss: grads must be ()")
            if self._d_out is None:
                raise ValueError("backward before a training ShardLoss")
            d = self._d_out
            if col.gathered:
                host = np.asarray(be.to_host(d))[:, col.lo : col.hi]
                d = be.to_device(np.ascontiguousarray(host))
        else:
            d = self._combine_sum(grads, lay.sizes[2 * stage + 2], f"stage {stage} grads")
        if len(layers) == 2:
            row = layers[1]
            be.matmul(tape.a, d, self._w(self.grads, row), trans_a=True)
            if row.b_size:
                be.bias_grad(d, self._b(self.grads, row))
            da = be.empty((batch, row.w_shape[0]), dtype=self.dtype)
            be.matmul(d, self._w(self.params, row), da, trans_b=True)
            if act == "identity":
                dh = da
            else:
                dh = be.empty(da.shape, dtype=self.dtype)
                be.activation_backward(act, tape.h, da, dh)
        else:
            dh = d
        be.matmul(tape.a_in, dh, self._w(self.grads, col), trans_a=True)
        be.bias_grad(dh, self._b(self.grads, col))
        partial = None
        if stage > 0 or input_grad:
            dx = be.empty((batch, col.w_shape[0]), dtype=self.dtype)
            be.matmul(dh, self._w(self.params, col), dx, trans_b=True)
            if tape.pre_input is not None:
                du = be.empty(dx.shape, dtype=self.dtype)
                be.activation_backward(act, tape.pre_input, dx, du)
                dx = du
            partial = be.to_host(dx)
        sq = float(be.squared_norm(self.grads)) if stage == 0 else None
        return ShardGrad(partial, sq)

    # -- phase 2: apply out of place, keeping the old state to roll back -------

    def _apply(self, scale: float) -> None:
        opt = self.optimizer
        if opt is None:
            raise ValueError("shard has no optimizer: send ShardConfigure first")
        if self._tapes[0] is None or self._d_out is None:
            raise ValueError("ShardApply without a completed backward")
        self._pending = False
        if scale < 1.0:
            self.backend.scale(self.grads, scale)
        self._undo.apply(self.backend, self, "params", opt, self.grads)  # a failure changes nothing
        self._tapes = [None] * self.layout.stages  # these gradients are spent
        self._d_out = None
        self._pending = True

    def _rollback(self) -> None:
        if not self._pending:
            raise ValueError("nothing to roll back: no ShardApply since the last step began")
        self._undo.rollback()
        self._pending = False

    # -- state ------------------------------------------------------------------

    def _configure(self, optimizer: OptimizerKind, loss: LossKind) -> None:
        if not isinstance(optimizer, OptimizerKind) or not isinstance(loss, LossKind):
            raise TypeError("ShardConfigure needs an OptimizerKind and a LossKind")
        if self.optimizer is None or self.optimizer.kind != optimizer:
            self.optimizer = optimizer.create(self.layout.n_params, self.backend, self.dtype)
        self.loss = loss

    def _gather(self, what: str) -> ShardSlice:
        if what == "params":
            buf = self.params
        elif what == "grads":
            buf = self.grads
        else:
            raise ValueError(f"ShardGather.what must be 'params' or 'grads', got {what!r}")
        return ShardSlice(self.layout.global_index(), np.asarray(self.backend.to_host(buf)))

    def _get_state(self) -> ShardState:
        if self.optimizer is None:
            raise ValueError("shard has no optimizer: send ShardConfigure first")
        return ShardState(
            self.layout.global_index(),
            np.asarray(self.backend.to_host(self.params)),
            self.optimizer.state_dict(),
            self.optimizer.step_count,
        )

    def _set_state(self, params: np.ndarray, optimizer: dict[str, Any], step: int) -> None:
        if self.optimizer is None:
            raise ValueError("shard has no optimizer: send ShardConfigure first")
        total = self.layout.total_params
        flat = np.asarray(params).reshape(-1)
        if flat.shape[0] != total:
            raise CheckpointError(f"{flat.shape[0]} weights for a model of {total} parameters")
        idx = self.layout.global_index()
        sliced: dict[str, Any] = {}
        for key, value in optimizer.items():
            if isinstance(value, np.ndarray) and value.ndim == 1 and value.shape[0] == total:
                sliced[key] = value[idx]
            else:
                sliced[key] = value
        sliced["step"] = int(step)
        fresh = self.optimizer.kind.create(self.layout.n_params, self.backend, self.dtype)
        try:
            fresh.load_state_dict(sliced)
        except (KeyError, ValueError, TypeError) as exc:
            raise CheckpointError(f"optimizer state does not fit the shard: {exc}") from exc
        host = np.ascontiguousarray(flat[idx], dtype=self.dtype)
        self.backend.copy(self.backend.to_device(host), self.params)
        self.optimizer = fresh
        self._pending = False
        self._undo.commit()
        self._tapes = [None] * self.layout.stages
        self._d_out = None

    def _info(self) -> ShardInfo:
        lay = self.layout
        return ShardInfo(
            rank=lay.rank,
            shard_count=lay.shard_count,
            model=self._template.config(),
            sizes=lay.sizes,
            total_params=lay.total_params,
            n_params=lay.n_params,
            stages=lay.stages,
            in_range=lay.in_range,
            output_range=lay.output_range,
        )

    # -- messages -----------------------------------------------------------------

    def _handler(self, message: Any) -> tuple[Callable[..., Any], tuple[Any, ...]] | None:
        if isinstance(message, ShardForward):
            return self._forward, (message.stage, tuple(message.inputs), bool(message.train))
        if isinstance(message, ShardBackward):
            return self._backward, (message.stage, tuple(message.grads), bool(message.input_grad))
        if isinstance(message, ShardLoss):
            return self._loss, (tuple(message.outputs), message.labels, bool(message.train))
        if isinstance(message, ShardApply):
            return self._apply, (float(message.scale),)
        if isinstance(message, ShardRollback):
            return self._rollback, ()
        if isinstance(message, ShardGather):
            return self._gather, (message.what,)
        if isinstance(message, ShardGetState):
            return self._get_state, ()
        if isinstance(message, ShardSetState):
            return self._set_state, (message.params, message.optimizer, message.step)
        if isinstance(message, ShardConfigure):
            return self._configure, (message.optimizer, message.loss)
        if isinstance(message, ShardDescribe):
            return self._info, ()
        return None

    async def receive(self, message: Any) -> Any:
        """Answer a `ShardProtocol` message (see the module docstring).

        Returns:
            The message's reply, or `Failure(exc)` for any error (the shard
            keeps its state and is not restarted) and for unknown messages
            (`TypeError`).
        """
        handler = self._handler(message)
        if handler is None:
            return Failure(TypeError(f"ShardActor does not handle {type(message).__name__}"))
        fn, args = handler
        try:
            if self.params is None:
                await self.on_device(self._build)
            result = await self.on_device(guarded, fn, *args)
        except Exception as exc:
            return Failure(exc)
        if isinstance(result, Rejected):
            return Failure(result.error)
        return result
