"""The layers of a GPT-style decoder: `Embedding` (token and position),
`LayerNorm`, `CausalSelfAttention`. Their kernels are `atomr.accel.sequence_ops`
(fused per row: LayerNorm in one pass, attention's scores, mask, softmax and
weighted sum in one)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from atomr.accel import sequence_ops as ops
from atomr.accel.hyperparameters import given_in
from atomr.train.core.model.inputs import model_dtype, positive_int
from atomr.train.core.model.layer import ForwardContext, Layer
from atomr.train.core.model.registry import register_layer
from atomr.train.core.validation import check_token_ids

__all__ = ["CausalSelfAttention", "Embedding", "LayerNorm"]


@register_layer
class Embedding(Layer):
    """Token and position embedding: `(B, T)` int ids -> `(B, T, d_model)`.

    `y[b, t] = tokens[ids[b, t]] + positions[t]`; both tables are drawn from
    `normal(0, 0.02)` (tokens first), as GPT-2's.

    Args:
        vocab: the number of token ids (>= 1).
        d_model: the embedding width.
        context: the longest sequence (rows of the position table).

    Raises:
        ValueError: an argument that is not a positive int.
    """

    kind = "embedding"

    def __init__(self, vocab: int, d_model: int, context: int) -> None:
        self.vocab = positive_int("vocab", vocab)
        self.d_model = positive_int("d_model", d_model)
        self.context = positive_int("context", context)

    def param_shapes(self) -> list[tuple[int, ...]]:
        """The token table `(vocab, d_model)`, then the positions `(context, d_model)`."""
        return [(self.vocab, self.d_model), (self.context, self.d_model)]

    def init_params(self, rng: np.random.Generator) -> list[np.ndarray]:
        """`normal(0, 0.02)` for both tables."""
        return [rng.normal(0.0, 0.02, size=s) for s in self.param_shapes()]

    def out_shape(self, in_shape: tuple[int, ...]) -> tuple[int, ...]:
        """`(T, d_model)` for ids `(T,)`.

        Raises:
            ValueError: not a sequence of at most `context` ids.
        """
        if len(in_shape) != 1 or not 1 <= in_shape[0] <= self.context:
            raise ValueError(f"Embedding takes (T,) ids with T <= {self.context}, got {in_shape}")
        return (in_shape[0], self.d_model)

    def forward(self, be: Any, params: list[Any], x: Any, ctx: ForwardContext) -> tuple[Any, Any]:
        """The lookups; keeps the ids.

        Raises:
            TypeError: host ids that are not integers.
            ValueError: host ids outside `[0, vocab)` (the lookup would read
                outside the table; the trainers check at their boundary, this
                guards a direct `Sequential.forward`, as `generate` makes).
        """
        tokens, positions = params
        ids = x.reshape(-1)
        if isinstance(ids, np.ndarray) and ids.size:
            check_token_ids(ids, self.vocab)
        y = be.empty((ids.shape[0], self.d_model), dtype=tokens.dtype)
        ops.embedding_forward(be, ids, tokens, positions, y, x.shape[1])
        return y.reshape((*x.shape, self.d_model)), (ids, x.shape[1])

    def backward(
        self,
        be: Any,
        params: list[Any],
        grads: list[Any],
        saved: Any,
        dy: Any,
        accumulate: bool,
        input_grad: bool,
    ) -> Any:
        """The tables' gradients; ids have no gradient (None)."""
        ids, t_len = saved
        dtokens, dpositions = grads
        dy2 = dy.reshape(-1, self.d_model)
        ops.embedding_backward(be, ids, dy2, dtokens, dpositions, t_len, accumulate)
        return None

    def cost(self, in_shape: tuple[int, ...]) -> float:
        """One add per output element."""
        return float(in_shape[0] * self.d_model)

    def config(self) -> dict[str, Any]:
        """`kind`, vocab, width, context."""
        return {"kind": self.kind, "vocab": self.vocab, "d_model": self.d_model,
                "context": self.context}  # fmt: skip


@register_layer
class LayerNorm(Layer):
    """LayerNorm over the last axis (torch's: biased variance, `eps` 1e-5),
    `gamma` initialised to 1 and `beta` to 0.

    `eps` is checked in float64 here, and in the model's dtype when a model
    is built (`check_dtype`): a float64 model may take `eps=1e-50`, which is
    0 in float32, and a float32 model refuses it.

    Raises:
        ValueError: `d_model` not a positive int, or `eps` not a number
            (a bool is none; NumPy's real scalars are) that is positive and
            finite, and not 0, in float64.
    """

    kind = "layernorm"

    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        self.d_model = positive_int("d_model", d_model)
        try:
            self.eps = given_in("eps", eps, np.float64)
        except TypeError as exc:  # a layer config that does not build is a ValueError
            raise ValueError(str(exc)) from None
        if not self.eps > 0:
            raise ValueError(f"eps must be positive, got {eps!r}")

    def check_dtype(self, dtype: np.dtype[Any]) -> None:
        """Check that `eps` is finite and not 0 in `dtype`.

        Raises:
            ValueError: `dtype` is not float32 or float64 (`model_dtype`), or
                `eps` is infinite or rounds to 0 in `dtype`.
        """
        dt = model_dtype(dtype)
        try:
            given_in("eps", self.eps, dt)
        except ValueError as exc:
            raise ValueError(f"LayerNorm cannot compute in {dt}: {exc}") from None

    def param_shapes(self) -> list[tuple[int, ...]]:
        """`gamma` `(d,)`, then `beta` `(d,)`."""
        return [(self.d_model,), (self.d_model,)]

    def init_params(self, rng: np.random.Generator) -> list[np.ndarray]:
        """Ones and zeros (nothing drawn)."""
        return [np.ones(self.d_model), np.zeros(self.d_model)]

    def out_shape(self, in_shape: tuple[int, ...]) -> tuple[int, ...]:
        """The input's shape.

        Raises:
            ValueError: the last axis is not `d_model`.
        """
        if not in_shape or in_shape[-1] != self.d_model:
            raise ValueError(f"LayerNorm({self.d_model}) cannot take inputs of shape {in_shape}")
        return in_shape

    def forward(self, be: Any, params: list[Any], x: Any, ctx: ForwardContext) -> tuple[Any, Any]:
        """Normalise each row; keeps the input and each row's mean and rstd.

        The mean and rstd are kept in float64, as the kernel computes them:
        rounded to float32, the backward's `x - mean` differed from the
        forward's (for rows far from 0 with a small spread, xhat and the
        gradients were wrong: `[1e8, 1e8 + 8]` gave xhat `[0, 2]`, not `[-1, 1]`).
        """
        gamma, beta = params
        x2 = x.reshape(-1, self.d_model)
        y = be.empty(x2.shape, dtype=x.dtype)
        mean = be.empty((x2.shape[0],), dtype=np.float64)
        rstd = be.empty((x2.shape[0],), dtype=np.float64)
        ops.layernorm_forward(be, x2, gamma, beta, y, mean, rstd, self.eps)
        return y.reshape(x.shape), (x2, mean, rstd)

    def backward(
        self,
        be: Any,
        params: list[Any],
        grads: list[Any],
        saved: Any,
        dy: Any,
        accumulate: bool,
        input_grad: bool,
    ) -> Any:
        """`dgamma`, `dbeta` and (when asked) `dx`."""
        x2, mean, rstd = saved
        dy2 = dy.reshape(-1, self.d_model)
        dx = be.empty(x2.shape, dtype=dy.dtype) if input_grad else None
        ops.layernorm_backward(
            be, x2, params[0], mean, rstd, dy2, dx, grads[0], grads[1], accumulate
        )
        return None if dx is None else dx.reshape(dy.shape)

    def cost(self, in_shape: tuple[int, ...]) -> float:
        """A few operations per element."""
        return 5.0 * float(np.prod(in_shape))

    def config(self) -> dict[str, Any]:
        """`kind`, width and eps."""
        return {"kind": self.kind, "d_model": self.d_model, "eps": self.eps}


@register_layer
class CausalSelfAttention(Layer):
    """Multi-head causal self-attention with its projections.

    `qkv = x @ W_qkv + b_qkv` `(d, 3d)`, heads of width `d / n_head`, the
    fused causal attention (`kernels/attention.py`), then `y = o @ W_o + b_o`.
    Weights uniform in `+-1/sqrt(d)`, as `Linear`'s.

    Args:
        d_model: the width; `n_head` must divide it.
        n_head: the heads.

    Raises:
        ValueError: widths that are not positive ints, or `n_head` not a
            divisor of `d_model`.
    """

    kind = "attention"

    def __init__(self, d_model: int, n_head: int) -> None:
        self.d_model = positive_int("d_model", d_model)
        self.n_head = positive_int("n_head", n_head)
        if self.d_model % self.n_head:
            raise ValueError(f"n_head {n_head} does not divide d_model {d_model}")
        self.scale = 1.0 / math.sqrt(self.d_model // self.n_head)

    def param_shapes(self) -> list[tuple[int, ...]]:
        """`W_qkv` `(d, 3d)`, `b_qkv` `(3d,)`, `W_o` `(d, d)`, `b_o` `(d,)`."""
        d = self.d_model
        return [(d, 3 * d), (3 * d,), (d, d), (d,)]

    def init_params(self, rng: np.random.Generator) -> list[np.ndarray]:
        """Uniform in `+-1/sqrt(d)`, in storage order."""
        bound = 1.0 / math.sqrt(self.d_model)
        return [rng.uniform(-bound, bound, size=s) for s in self.param_shapes()]

    def out_shape(self, in_shape: tuple[int, ...]) -> tuple[int, ...]:
        """The input's shape, `(T, d_model)`.

        Raises:
            ValueError: not `(T, d_model)`.
        """
        if len(in_shape) != 2 or in_shape[1] != self.d_model:
            raise ValueError(f"attention takes (T, {self.d_model}) inputs, got {in_shape}")
        return in_shape

    def forward(self, be: Any, params: list[Any], x: Any, ctx: ForwardContext) -> tuple[Any, Any]:
        """Projections and attention; keeps the input, `qkv`, the weights and `o`."""
        w_qkv, b_qkv, w_o, b_o = params
        batch, t_len, d = x.shape
        x2 = x.reshape(-1, d)
        qkv = be.empty((x2.shape[0], 3 * d), dtype=x.dtype)
        be.matmul_unchecked(x2, w_qkv, qkv, False, False, False)
        be.bias_add_unchecked(qkv, b_qkv)
        p = be.empty((batch * self.n_head, t_len, t_len), dtype=x.dtype)
        o = be.empty((x2.shape[0], d), dtype=x.dtype)
        ops.attention_forward(be, qkv, p, o, self.n_head, self.scale)
        y = be.empty((x2.shape[0], d), dtype=x.dtype)
        be.matmul_unchecked(o, w_o, y, False, False, False)
        be.bias_add_unchecked(y, b_o)
        return y.reshape(x.shape), (x2, qkv, p, o)

    def backward(
        self,
        be: Any,
        params: list[Any],
        grads: list[Any],
        saved: Any,
        dy: Any,
        accumulate: bool,
        input_grad: bool,
    ) -> Any:
        """The four parameter gradients and (when asked) `dx`."""
        w_qkv, _, w_o, _ = params
        g_qkv, gb_qkv, g_o, gb_o = grads
        x2, qkv, p, o = saved
        d = self.d_model
        dy2 = dy.reshape(-1, d)
        be.matmul_unchecked(o, dy2, g_o, True, False, accumulate)
        be.bias_grad_unchecked(dy2, gb_o, accumulate)
        do = be.empty(o.shape, dtype=o.dtype)
        be.matmul_unchecked(dy2, w_o, do, False, True, False)
        dqkv = be.empty(qkv.shape, dtype=qkv.dtype)
        ds = be.empty(p.shape, dtype=p.dtype)
        ops.attention_backward(be, qkv, p, do, ds, dqkv, self.n_head, self.scale)
        be.matmul_unchecked(x2, dqkv, g_qkv, True, False, accumulate)
        be.bias_grad_unchecked(dqkv, gb_qkv, accumulate)
        if not input_grad:
            return None
        dx = be.empty(x2.shape, dtype=x2.dtype)
        be.matmul_unchecked(dqkv, w_qkv, dx, False, True, False)
        return dx.reshape(dy.shape)

    def cost(self, in_shape: tuple[int, ...]) -> float:
        """Multiply-adds per sample: the projections and the T x T scores."""
        t_len, d = in_shape
        return float(t_len * 4 * d * d + t_len * t_len * d)

    def config(self) -> dict[str, Any]:
        """`kind`, width and heads."""
        return {"kind": self.kind, "d_model": self.d_model, "n_head": self.n_head}
