"""`ShardMath`: the math of a tensor-parallel shard (`ShardActor`), phase 1
of a step: the forward of each stage, the loss and the backward, on the
device's worker thread, touching no weights.

A stage is a column-parallel layer and the row-parallel layer after it (the
Megatron-LM pairing of `atomr.train.tensor_parallel.sharding`); a
row-parallel layer ends in a partial sum that the shards all-reduce
(`sum_partials`). The public methods are the hooks `ShardActor` documents
for subclasses to override.

`ShardActor` (shard.py) is the actor: it sets the attributes below in its
constructor and adds the update (phase 2), the state and the messages.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from atomr.accel import ACTIVATIONS, DeviceActor
from atomr.train._recovery import DoubleBuffer
from atomr.train.core._step_checks import check_loss, check_normaliser
from atomr.train.core.loss import LossKind
from atomr.train.tensor_parallel.messages import LossResult, ShardGrad
from atomr.train.tensor_parallel.sharding import LayerShard, ShardLayout

__all__ = ["ShardMath", "StageTape"]


@dataclass
class StageTape:
    """What a stage's forward keeps for its backward."""

    pre_input: Any  # the combined pre-activation input (stage > 0), else None
    a_in: Any  # the column layer's input
    h: Any  # the column layer's output (pre-activation)
    a: Any = None  # the row layer's input (activation of h)


class ShardMath(DeviceActor):
    """The forward, loss and backward of one shard (module docstring).

    It has no constructor of its own: `ShardActor.__init__` sets every
    attribute below.
    """

    layout: ShardLayout
    activation: str
    dtype: np.dtype
    params: Any
    grads: Any
    loss: LossKind | None
    _tapes: list[StageTape | None]
    _batch: int
    _d_out: Any
    _undo: DoubleBuffer
    _pending: bool

    def _w(self, buf: Any, ls: LayerShard) -> Any:
        return buf[ls.w_offset : ls.b_offset].reshape(ls.w_shape)

    def _b(self, buf: Any, ls: LayerShard) -> Any:
        return buf[ls.b_offset : ls.stop]

    def _dev(self, host: np.ndarray) -> Any:
        arr = np.ascontiguousarray(host, dtype=self.dtype)
        return self.backend.to_device(arr) if self.device.is_cuda else arr

    def _reply(self, buf: Any) -> np.ndarray:
        """`buf`, a buffer this pass made and writes no more, as a host array
        for a reply: on a CPU device the buffer itself, made read-only (the
        trainer and the other shards only read it; a copy per reply cost
        about 50 us on a 512 KB partial here), else a host copy."""
        if self.device.is_cuda:
            return self.backend.to_host(buf)
        buf.flags.writeable = False
        return buf

    def sum_partials(self, parts: tuple[np.ndarray, ...], width: int, what: str) -> Any:
        """A row-parallel layer's all-reduce (worker thread): the device sum
        of `parts`, one `(batch, width)` partial per shard (`what` names them).

        Raises:
            ValueError: not one array of that shape per shard.
        """
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
        # checked above; `_dev` makes them contiguous, in this shard's dtype
        self.backend.sum_into_unchecked(out.reshape(-1), [self._dev(p).reshape(-1) for p in parts])
        return out

    # -- phase 1: forward, loss, backward (weights untouched) -------------------

    def _activate(self, u: Any) -> Any:
        """The activation of `u` (`u` itself for "identity")."""
        if self.activation == "identity":
            return u
        out = self.backend.empty(u.shape, dtype=self.dtype)
        code = ACTIVATIONS[self.activation]  # the model's, checked when it was built
        self.backend.activation_forward_unchecked(code, u.reshape(-1), out.reshape(-1))
        return out

    def _activation_grad(self, pre: Any, d: Any) -> Any:
        """d(loss)/d(pre) from d(loss)/d(activation of pre)."""
        if self.activation == "identity":
            return d
        out = self.backend.empty(d.shape, dtype=self.dtype)
        code = ACTIVATIONS[self.activation]
        self.backend.activation_backward_unchecked(
            code, pre.reshape(-1), d.reshape(-1), out.reshape(-1)
        )
        return out

    def _check_stage(self, stage: int) -> tuple[LayerShard, ...]:
        if not 0 <= stage < self.layout.stages:
            raise ValueError(f"stage must be in [0, {self.layout.stages}), got {stage}")
        return self.layout.stage_layers(stage)

    def forward_stage(self, stage: int, inputs: tuple[np.ndarray, ...], train: bool) -> np.ndarray:
        """`ShardForward` (worker thread): this shard's part of one stage,
        answered with its output slice or partial sum (host).

        Raises:
            ValueError: a stage out of order or inputs of the wrong shape.
        """
        be = self.backend
        col, *row = self._check_stage(stage)
        pre_input, a_in = self._stage_input(stage, inputs, train, col)
        h = be.empty((self._batch, col.w_shape[1]), dtype=self.dtype)
        be.matmul_unchecked(a_in, self._w(self.params, col), h, False, False, False)
        be.bias_add_unchecked(h, self._b(self.params, col))
        tape = StageTape(pre_input, a_in, h)
        self._tapes[stage] = tape
        if col.gathered:
            return self._reply(h)
        tape.a = self._activate(h)
        part = be.empty((self._batch, row[0].w_shape[1]), dtype=self.dtype)
        be.matmul_unchecked(tape.a, self._w(self.params, row[0]), part, False, False, False)
        if row[0].b_size:
            be.bias_add_unchecked(part, self._b(self.params, row[0]))
        return self._reply(part)

    def _stage_input(
        self, stage: int, inputs: tuple[np.ndarray, ...], train: bool, col: LayerShard
    ) -> tuple[Any, Any]:
        """`(pre-activation input or None, the column layer's input)` of a stage."""
        if stage == 0:
            return None, self._first_input(inputs, train)
        if self._tapes[stage - 1] is None:
            raise ValueError(f"stage {stage} before stage {stage - 1}")
        u = self.sum_partials(inputs, col.w_shape[0], f"stage {stage} inputs")
        a_in = self._activate(u)
        return (None if a_in is u else u), a_in

    def _first_input(self, inputs: tuple[np.ndarray, ...], train: bool) -> Any:
        """Check stage 0's input and begin a new pass (a training pass commits
        the last apply: it can no longer be rolled back)."""
        sizes = self.layout.sizes
        if len(inputs) != 1 or not isinstance(inputs[0], np.ndarray):
            raise ValueError("stage 0 takes one input array")
        x = inputs[0]
        if x.ndim != 2 or x.shape[1] != sizes[0] or x.shape[0] < 1:
            raise ValueError(f"stage 0 input must be (batch, {sizes[0]}), got {x.shape}")
        self._batch = x.shape[0]
        self._tapes = [None] * self.layout.stages
        self._d_out = None
        if train:
            self._pending = False
            self._undo.commit()
        return self._dev(x)

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
        return self.sum_partials(outputs, out_width, "outputs")

    def compute_loss(
        self, outputs: tuple[np.ndarray, ...], labels: np.ndarray, train: bool
    ) -> LossResult:
        """`ShardLoss` (worker thread): the loss of the combined outputs.

        Raises:
            ValueError: no loss configured, or before the last forward stage.
            InvalidBatchError, NonFiniteError: bad labels, a non-finite loss.
        """
        if self.loss is None:
            raise ValueError("shard has no loss: send ShardConfigure first")
        if self._tapes[-1] is None:
            raise ValueError("ShardLoss before the last forward stage")
        be = self.backend
        out = self._output(outputs)
        y = labels  # validated by the trainer (`validate_batch`)
        grad = be.empty(out.shape, dtype=self.dtype)
        loss_sum, norm = self.loss.sums(be, out, be.to_device(y), grad)
        if train:  # an evaluation's loss is checked where its answer is made (`evaluation`)
            check_loss(loss_sum)
            check_normaliser(norm)
        correct = -1
        if not train and self.loss.is_classification:
            correct = int(np.sum(np.argmax(be.to_host(out), axis=1) == y))
        if train:
            be.scale_unchecked(grad.reshape(-1), grad.dtype.type(1.0 / norm))  # as `Trainer`
            self._d_out = grad
        return LossResult(float(loss_sum), float(norm), correct)

    def backward_stage(
        self, stage: int, grads: tuple[np.ndarray, ...], input_grad: bool
    ) -> ShardGrad:
        """`ShardBackward` (worker thread): this shard's part of one stage.

        Raises:
            ValueError: before its forward, or gradients of the wrong shape.
        """
        be = self.backend
        col, *row = self._check_stage(stage)
        tape = self._tapes[stage]
        if tape is None:
            raise ValueError(f"backward of stage {stage} before its forward")
        d = self._stage_output_grad(stage, grads, col)
        if row:
            be.matmul_unchecked(tape.a, d, self._w(self.grads, row[0]), True, False, False)
            if row[0].b_size:
                be.bias_grad_unchecked(d, self._b(self.grads, row[0]), False)
            da = be.empty((self._batch, row[0].w_shape[0]), dtype=self.dtype)
            be.matmul_unchecked(d, self._w(self.params, row[0]), da, False, True, False)
            d = self._activation_grad(tape.h, da)
        be.matmul_unchecked(tape.a_in, d, self._w(self.grads, col), True, False, False)
        be.bias_grad_unchecked(d, self._b(self.grads, col), False)
        partial = None
        if stage > 0 or input_grad:
            dx = be.empty((self._batch, col.w_shape[0]), dtype=self.dtype)
            be.matmul_unchecked(d, self._w(self.params, col), dx, False, True, False)
            if tape.pre_input is not None:
                dx = self._activation_grad(tape.pre_input, dx)
            partial = self._reply(dx)
        sq = float(be.squared_norm_unchecked(self.grads)) if stage == 0 else None
        return ShardGrad(partial, sq)

    def _stage_output_grad(self, stage: int, grads: tuple[np.ndarray, ...], col: LayerShard) -> Any:
        """d(mean loss)/d(stage output): the loss's on the last stage, else the
        sum of the next stage's partial input gradients."""
        lay = self.layout
        if stage < lay.stages - 1:
            return self.sum_partials(grads, lay.sizes[2 * stage + 2], f"stage {stage} grads")
        if grads:
            raise ValueError("the last stage's backward starts from the loss: grads must be ()")
        if self._d_out is None:
            raise ValueError("backward before a training ShardLoss")
        if not col.gathered:
            return self._d_out
        if not self.device.is_cuda:  # one copy of the slice, not three
            return np.ascontiguousarray(self._d_out[:, col.lo : col.hi])
        host = np.asarray(self.backend.to_host(self._d_out))[:, col.lo : col.hi]
        return self.backend.to_device(np.ascontiguousarray(host))
