"""The layers as one tensor-parallel shard holds them (Megatron-LM's rules;
`shard_plan` decides which layer follows which rule): each says which
meeting of the shards (`ThreadGroup`) its forward and backward need.

| rule | shard k holds | forward | backward |
|---|---|---|---|
| column `Linear` before a row one | `W[:, cols_k]`, `b[cols_k]` | its slice of the output | all-reduce of the input gradient |
| column `Linear` otherwise | the same | all-gather of the output | its slice of the gradient; all-reduce of the input gradient |
| row `Linear` | `W[rows_k, :]`, `b` (added by shard 0) | all-reduce of the partial outputs | its slice of the input gradient |
| heads (`CausalSelfAttention`) | its heads' q, k, v columns and `W_o` rows, `b_o` (shard 0) | all-reduce of the partial outputs | all-reduce of the input gradient |
| replicated (`LayerNorm`, `Embedding`, activations, dropout) | the whole layer | as on one device | as on one device |

Between a column layer and its row layer only element-wise layers may
stand (the activation). Every shard sees the whole batch, so replicated
layers compute the same bits on every shard and their gradients need no
reduction; `LocalLayer.replicated` marks such parameters, counted once in
the gradient norm.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from atomr.accel import sequence_ops as ops
from atomr.train.core.model.layer import ForwardContext, Layer
from atomr.train.core.model.linear import Linear
from atomr.train.core.model.transformer import CausalSelfAttention
from atomr.train.tensor_parallel._thread_group import ThreadGroup

__all__ = ["HeadAttention", "LocalLayer", "Meeting", "ShardedLinear"]


class Meeting:
    """A shard's place in its group (its rank, and the group it meets)."""

    def __init__(self, group: ThreadGroup, rank: int) -> None:
        self.group, self.rank = group, rank

    def reduce(self, be: Any, x: Any) -> Any:
        """The sum over the shards of `x`, on this shard's device."""
        out = self.group.all_reduce(self.rank, np.asarray(be.to_host(x)))
        return be.to_device(out)

    def gather(self, be: Any, x: Any) -> Any:
        """Every shard's `x` joined along the last axis, on this shard's device."""
        return be.to_device(self.group.all_gather(self.rank, np.asarray(be.to_host(x))))


class LocalLayer(Layer):
    """A layer as one shard holds it (built by `plan_shards`; not in configs).

    Attributes:
        replicated: per parameter, whether every shard holds the same values.
    """

    kind = "tp-local"
    replicated: list[bool]

    def config(self) -> dict[str, Any]:
        """A description for messages (local layers are not saved)."""
        return {"kind": self.kind, "shapes": self.param_shapes()}


class ShardedLinear(LocalLayer):
    """A column (`mode` "column" or "gather") or row slice of a `Linear`."""

    def __init__(
        self, inner: Linear, mode: str, meeting: Meeting, offset: int = 0, full_out: int = 0
    ) -> None:
        self.inner, self.mode, self.meeting = inner, mode, meeting
        self.offset, self.full_out = offset, full_out  # "gather": this shard's first column
        self.replicated = [False, mode == "row"]

    def param_shapes(self) -> list[tuple[int, ...]]:
        return self.inner.param_shapes()

    def out_shape(self, in_shape: tuple[int, ...]) -> tuple[int, ...]:
        shape = self.inner.out_shape(in_shape)
        return (*shape[:-1], self.full_out) if self.mode == "gather" else shape

    def forward(self, be: Any, params: list[Any], x: Any, ctx: ForwardContext) -> tuple[Any, Any]:
        w, b = params
        x2 = x.reshape(-1, self.inner.in_features)
        y = be.empty((x2.shape[0], self.inner.out_features), dtype=w.dtype)
        be.matmul_unchecked(x2, w, y, False, False, False)
        if self.mode != "row" or self.meeting.rank == 0:
            be.bias_add_unchecked(y, b)
        if self.mode == "row":
            y = self.meeting.reduce(be, y)
        elif self.mode == "gather":
            y = self.meeting.gather(be, y)
        return y.reshape((*x.shape[:-1], y.shape[1])), x2

    def backward(self, be, params, grads, saved, dy, accumulate, input_grad):  # noqa: ANN001, ANN201
        w = params[0]
        gw, gb = grads
        dy2 = dy.reshape(-1, dy.shape[dy.ndim - 1])
        if self.mode == "gather":  # this shard's columns of the gathered gradient
            lo = self.offset
            host = np.asarray(be.to_host(dy2))[:, lo : lo + self.inner.out_features]
            dy2 = be.to_device(np.ascontiguousarray(host))
        be.matmul_unchecked(saved, dy2, gw, True, False, accumulate)
        if self.mode != "row" or self.meeting.rank == 0:
            be.bias_grad_unchecked(dy2, gb, accumulate)
        elif not accumulate:
            be.scale(gb, 0.0)
        if not input_grad:
            return None
        dx = be.empty((dy2.shape[0], self.inner.in_features), dtype=w.dtype)
        be.matmul_unchecked(dy2, w, dx, False, True, False)
        if self.mode != "row":
            dx = self.meeting.reduce(be, dx)
        return dx.reshape((*dy.shape[:-1], self.inner.in_features))


class HeadAttention(LocalLayer):
    """Attention over this shard's heads; partial outputs all-reduced."""

    def __init__(self, inner: CausalSelfAttention, meeting: Meeting, d_model: int) -> None:
        self.inner, self.meeting = inner, meeting  # inner: this shard's heads and width
        self.replicated = [False, False, False, True]
        self.d_model = d_model

    def param_shapes(self) -> list[tuple[int, ...]]:
        d, dk = self.d_model, self.inner.d_model
        return [(d, 3 * dk), (3 * dk,), (dk, d), (d,)]

    def out_shape(self, in_shape: tuple[int, ...]) -> tuple[int, ...]:
        return in_shape

    def forward(self, be: Any, params: list[Any], x: Any, ctx: ForwardContext) -> tuple[Any, Any]:
        w_qkv, b_qkv, w_o, b_o = params
        batch, t_len, d = x.shape
        dk, heads = self.inner.d_model, self.inner.n_head
        x2 = x.reshape(-1, d)
        qkv = be.empty((x2.shape[0], 3 * dk), dtype=x.dtype)
        be.matmul_unchecked(x2, w_qkv, qkv, False, False, False)
        be.bias_add_unchecked(qkv, b_qkv)
        p = be.empty((batch * heads, t_len, t_len), dtype=x.dtype)
        o = be.empty((x2.shape[0], dk), dtype=x.dtype)
        ops.attention_forward(be, qkv, p, o, heads, self.inner.scale)
        y = be.empty((x2.shape[0], d), dtype=x.dtype)
        be.matmul_unchecked(o, w_o, y, False, False, False)
        if self.meeting.rank == 0:
            be.bias_add_unchecked(y, b_o)
        return self.meeting.reduce(be, y).reshape(x.shape), (x2, qkv, p, o)

    def backward(self, be, params, grads, saved, dy, accumulate, input_grad):  # noqa: ANN001, ANN201
        w_qkv, _, w_o, _ = params
        g_qkv, gb_qkv, g_o, gb_o = grads
        x2, qkv, p, o = saved
        dy2 = dy.reshape(-1, self.d_model)
        be.matmul_unchecked(o, dy2, g_o, True, False, accumulate)
        if self.meeting.rank == 0:
            be.bias_grad_unchecked(dy2, gb_o, accumulate)
        elif not accumulate:
            be.scale(gb_o, 0.0)
        do = be.empty(o.shape, dtype=o.dtype)
        be.matmul_unchecked(dy2, w_o, do, False, True, False)
        dqkv = be.empty(qkv.shape, dtype=qkv.dtype)
        ds = be.empty(p.shape, dtype=p.dtype)
        ops.attention_backward(be, qkv, p, do, ds, dqkv, self.inner.n_head, self.inner.scale)
        be.matmul_unchecked(x2, dqkv, g_qkv, True, False, accumulate)
        be.bias_grad_unchecked(dqkv, gb_qkv, accumulate)
        if not input_grad:
            return None
        dx = be.empty(x2.shape, dtype=x2.dtype)
        be.matmul_unchecked(dqkv, w_qkv, dx, False, True, False)
        return self.meeting.reduce(be, dx).reshape(dy.shape)
