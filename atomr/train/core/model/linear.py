"""`Linear` and `Activation`: the layers an `Mlp` is made of.

Their kernels and their order are the MLP's own (matmul, bias add,
activation; backward: activation, weight gradient, bias gradient, input
gradient), so an `Mlp` built from them computes the same bits it always did.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from atomr.accel import ACTIVATIONS
from atomr.train.core.model.inputs import positive_int
from atomr.train.core.model.layer import ForwardContext, Layer
from atomr.train.core.model.registry import register_layer

__all__ = ["Activation", "Linear"]


@register_layer
class Linear(Layer):
    """`y = x @ W + b` over the last axis.

    `W` is `(in_features, out_features)` then `b` `(out_features,)`, both drawn
    from `uniform(-1/sqrt(in), 1/sqrt(in))` (W first), as `Mlp` always has.

    Args:
        in_features, out_features: the widths (>= 1).
        tp: its tensor-parallel rule: "column" (the default), "row" or
            "replicated".

    Raises:
        ValueError: a width that is not a positive int, or an unknown rule.
    """

    kind = "linear"

    def __init__(self, in_features: int, out_features: int, tp: str = "column") -> None:
        self.in_features = positive_int("in_features", in_features)
        self.out_features = positive_int("out_features", out_features)
        if tp not in ("column", "row", "replicated"):
            raise ValueError(f"tp must be 'column', 'row' or 'replicated', got {tp!r}")
        self.tp = tp

    def param_shapes(self) -> list[tuple[int, ...]]:
        """`W` `(in, out)`, then `b` `(out,)`."""
        return [(self.in_features, self.out_features), (self.out_features,)]

    def init_params(self, rng: np.random.Generator) -> list[np.ndarray]:
        """`W` then `b`, uniform in `+-1/sqrt(in_features)`."""
        bound = 1.0 / math.sqrt(self.in_features)
        w = rng.uniform(-bound, bound, size=self.in_features * self.out_features)
        b = rng.uniform(-bound, bound, size=self.out_features)
        return [w.reshape(self.in_features, self.out_features), b]

    def out_shape(self, in_shape: tuple[int, ...]) -> tuple[int, ...]:
        """`in_shape` with its last axis `out_features`.

        Raises:
            ValueError: the last axis is not `in_features`.
        """
        if not in_shape or in_shape[-1] != self.in_features:
            raise ValueError(
                f"Linear({self.in_features}, ...) cannot take inputs of shape {in_shape}"
            )
        return (*in_shape[:-1], self.out_features)

    def forward(self, be: Any, params: list[Any], x: Any, ctx: ForwardContext) -> tuple[Any, Any]:
        """`x @ W + b`; keeps the 2-D input."""
        w, b = params
        x2 = x.reshape(-1, self.in_features)
        z = be.empty((x2.shape[0], self.out_features), dtype=w.dtype)
        be.matmul_unchecked(x2, w, z, False, False, False)
        be.bias_add_unchecked(z, b)
        return z.reshape((*x.shape[:-1], self.out_features)), x2

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
        """`dW = x^T dy`, `db = sum_rows(dy)`, `dx = dy W^T`."""
        w = params[0]
        gw, gb = grads
        dy2 = dy.reshape(-1, self.out_features)
        be.matmul_unchecked(saved, dy2, gw, True, False, accumulate)
        be.bias_grad_unchecked(dy2, gb, accumulate)
        if not input_grad:
            return None
        dx = be.empty((dy2.shape[0], self.in_features), dtype=w.dtype)
        be.matmul_unchecked(dy2, w, dx, False, True, False)
        return dx.reshape((*dy.shape[:-1], self.in_features))

    def cost(self, in_shape: tuple[int, ...]) -> float:
        """Multiply-adds per sample: rows x in x out."""
        rows = int(np.prod(in_shape[:-1])) if len(in_shape) > 1 else 1
        return float(rows * self.in_features * self.out_features)

    def config(self) -> dict[str, Any]:
        """`kind`, the widths and the rule."""
        return {"kind": self.kind, "in_features": self.in_features,
                "out_features": self.out_features, "tp": self.tp}  # fmt: skip


@register_layer
class Activation(Layer):
    """An element-wise activation: "relu", "tanh", "gelu" (tanh approximation,
    as torch's `gelu(approximate="tanh")`) or "identity".

    Raises:
        ValueError: an unknown name.
    """

    kind = "activation"

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or name not in ACTIVATIONS:
            raise ValueError(f"unknown activation {name!r}; expected one of {tuple(ACTIVATIONS)}")
        self.name = name
        self.code = ACTIVATIONS[name]

    def out_shape(self, in_shape: tuple[int, ...]) -> tuple[int, ...]:
        """The input's shape."""
        return in_shape

    def forward(self, be: Any, params: list[Any], x: Any, ctx: ForwardContext) -> tuple[Any, Any]:
        """`f(x)`; keeps `x`."""
        y = be.empty(x.shape, dtype=x.dtype)
        be.activation_forward_unchecked(self.code, x.reshape(-1), y.reshape(-1))
        return y, x

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
        """`dy * f'(x)` (when asked)."""
        if not input_grad:
            return None
        dx = be.empty(dy.shape, dtype=dy.dtype)
        be.activation_backward_unchecked(
            self.code, saved.reshape(-1), dy.reshape(-1), dx.reshape(-1)
        )
        return dx

    def cost(self, in_shape: tuple[int, ...]) -> float:
        """One operation per element."""
        return float(np.prod(in_shape))

    def config(self) -> dict[str, Any]:
        """`kind` and the activation's name."""
        return {"kind": self.kind, "name": self.name}
