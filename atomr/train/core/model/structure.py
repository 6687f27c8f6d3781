"""`Residual` (a block added to its input) and `Dropout` (seeded by step and sample)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Integral, Real
from typing import Any

import numpy as np

from atomr.accel import sequence_ops as ops
from atomr.actor.errors import bounded_repr
from atomr.train.core.model.inputs import known_keys
from atomr.train.core.model.layer import ForwardContext, Layer, backward_checked, forward_checked
from atomr.train.core.model.registry import layer_from_config, register_layer

__all__ = ["Dropout", "Residual", "drop_probability"]


def drop_probability(name: str, p: object) -> float:
    """`p` as a float, checked to be a drop probability: a number in [0, 1).

    Raises:
        ValueError: anything else, a bool or NaN included (the message names
            `name`); NumPy's real scalars are numbers.
    """
    if isinstance(p, bool) or not (
        isinstance(p, Real) and math.isfinite(p) and 0.0 <= float(p) < 1.0
    ):
        raise ValueError(f"{name} must be a number in [0, 1), got {bounded_repr(p)}")
    return float(p)


def param_counts(layers: Sequence[Layer]) -> list[int]:
    """How many parameter arrays each layer has."""
    return [len(layer.param_shapes()) for layer in layers]


@register_layer
class Residual(Layer):
    """`y = x + f(x)`, `f` the given layers in order (a transformer block's halves).

    Args:
        layers: the block; each must keep the input's shape overall.

    Raises:
        ValueError: no layers, or something that is not a `Layer`.
    """

    kind = "residual"

    def __init__(self, layers: Sequence[Layer]) -> None:
        self.layers = list(layers)
        if not self.layers or not all(isinstance(layer, Layer) for layer in self.layers):
            raise ValueError("Residual needs a non-empty list of Layers")
        self._counts = param_counts(self.layers)
        self._shapes_by_input: dict[tuple[int, ...], list[tuple[int, ...]]] = {}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Residual:
        """Rebuild from `config()` (each inner layer by its kind).

        Raises:
            ValueError: no `layers` list, a key other than `kind` and
                `layers`, or an inner config that does not build.
        """
        known_keys("a residual layer", config, ("kind", "layers"))
        inner = config.get("layers")
        if not isinstance(inner, list):
            raise ValueError("a residual config needs a 'layers' list")
        return cls([layer_from_config(c) for c in inner])

    def param_shapes(self) -> list[tuple[int, ...]]:
        """The inner layers' shapes, in order."""
        return [s for layer in self.layers for s in layer.param_shapes()]

    def init_params(self, rng: np.random.Generator) -> list[np.ndarray]:
        """The inner layers' initial values, in order."""
        return [a for layer in self.layers for a in layer.init_params(rng)]

    def _split(self, arrays: list[Any]) -> list[list[Any]]:
        parts, at = [], 0
        for count in self._counts:
            parts.append(arrays[at : at + count])
            at += count
        return parts

    def _shapes(self, in_shape: tuple[int, ...]) -> list[tuple[int, ...]]:
        """The shape entering each inner layer, then the block's output's
        (worked out once per input shape: every pass asks, both ways).

        Raises:
            ValueError: an inner layer refuses its input.
        """
        shapes = self._shapes_by_input.get(in_shape)
        if shapes is None:
            shapes = [in_shape]
            for layer in self.layers:
                shapes.append(tuple(int(d) for d in layer.out_shape(shapes[-1])))
            self._shapes_by_input[in_shape] = shapes
        return shapes

    def out_shape(self, in_shape: tuple[int, ...]) -> tuple[int, ...]:
        """The input's shape.

        Raises:
            ValueError: an inner layer refuses its input, or the block changes the shape.
        """
        shape = self._shapes(in_shape)[-1]
        if shape != in_shape:
            raise ValueError(f"a residual block must keep its shape {in_shape}, it gives {shape}")
        return in_shape

    def forward(self, be: Any, params: list[Any], x: Any, ctx: ForwardContext) -> tuple[Any, Any]:
        """`x + f(x)`; keeps each inner layer's saved state."""
        saved, h = [], x
        shapes = self._shapes(tuple(x.shape[1:]))
        for j, (layer, p) in enumerate(zip(self.layers, self._split(params), strict=True)):
            h, s = forward_checked(layer, be, p, h, ctx, shapes[j + 1])
            saved.append(s)
        y = be.empty(x.shape, dtype=h.dtype)
        be.copy_unchecked(x, y)
        be.axpy_unchecked(y.dtype.type(1.0), h.reshape(-1), y.reshape(-1))
        return y, saved

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
        """The inner layers backward; `dx = dy + df/dx`."""
        g = dy
        shapes = self._shapes(tuple(dy.shape[1:]))
        pairs = list(zip(self.layers, self._split(params), self._split(grads), saved, strict=True))
        for j in range(len(pairs) - 1, -1, -1):
            layer, p, gr, s = pairs[j]
            g = backward_checked(layer, be, p, gr, s, g, accumulate, True, shapes[j])
        if not input_grad:
            return None
        dx = be.empty(dy.shape, dtype=dy.dtype)  # `g` may be `dy` itself (an identity inside)
        be.copy_unchecked(dy, dx)
        be.axpy_unchecked(dx.dtype.type(1.0), g.reshape(-1), dx.reshape(-1))
        return dx

    def check_dtype(self, dtype: np.dtype[Any]) -> None:
        """Each inner layer's `check_dtype`.

        Raises:
            ValueError: an inner layer cannot compute in `dtype`.
        """
        for layer in self.layers:
            layer.check_dtype(dtype)

    def cost(self, in_shape: tuple[int, ...]) -> float:
        """The inner layers' costs."""
        shapes = self._shapes(in_shape)
        return sum(
            (layer.cost(shape) for layer, shape in zip(self.layers, shapes[:-1], strict=True)), 0.0
        )

    def config(self) -> dict[str, Any]:
        """`kind` and the inner layers' configs."""
        return {"kind": self.kind, "layers": [layer.config() for layer in self.layers]}


@register_layer
class Dropout(Layer):
    """Zero each element with probability `p` in training (scale the rest by
    `1 / (1 - p)`); the identity in evaluation.

    The mask is a function of `(seed, step, sample, position)`
    (`kernels/dropout.py`): sample is the row's index in the whole batch
    (`ForwardContext.sample_offset` + its row), so data, pipeline and tensor
    parallel draw the masks one device draws.

    Args:
        p: the drop probability, in [0, 1).
        seed: this layer's seed, in [0, 2**32) (layers with different seeds
            drop differently; layers of one shape with the same seed drop
            the same positions).

    Raises:
        ValueError: `p` out of range, or `seed` not an int in [0, 2**32).
    """

    kind = "dropout"

    def __init__(self, p: float, seed: int = 0) -> None:
        self.p = drop_probability("p", p)
        if isinstance(seed, bool) or not isinstance(seed, Integral) or not 0 <= seed < 2**32:
            # the kernel draws from 32 bits: 2**32 + 1 would repeat seed 1's masks
            raise ValueError(f"seed must be an int in [0, 2**32), got {bounded_repr(seed)}")
        self.seed: int = int(seed)

    def out_shape(self, in_shape: tuple[int, ...]) -> tuple[int, ...]:
        """The input's shape."""
        return in_shape

    def forward(self, be: Any, params: list[Any], x: Any, ctx: ForwardContext) -> tuple[Any, Any]:
        """Masked and scaled in training; `x` itself otherwise."""
        if not ctx.train or self.p == 0.0:
            return x, None
        per_sample = int(np.prod(x.shape[1:]))
        y = be.empty(x.shape, dtype=x.dtype)
        self._apply(be, x, y, (per_sample, ctx.sample_offset, ctx.step))
        return y, (per_sample, ctx.sample_offset, ctx.step)

    def _apply(self, be: Any, x: Any, y: Any, key: tuple[int, int, int]) -> None:
        per_sample, offset, step = key
        ops.dropout_apply(
            be, x.reshape(-1), y.reshape(-1), per_sample, offset, step, self.seed, self.p
        )

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
        """The same mask on the gradient."""
        if not input_grad:
            return None
        if saved is None:
            return dy
        dx = be.empty(dy.shape, dtype=dy.dtype)
        self._apply(be, dy, dx, saved)
        return dx

    def cost(self, in_shape: tuple[int, ...]) -> float:
        """One operation per element."""
        return float(np.prod(in_shape))

    def config(self) -> dict[str, Any]:
        """`kind`, `p` and `seed`."""
        return {"kind": self.kind, "p": self.p, "seed": self.seed}
