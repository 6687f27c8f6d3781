"""Where a `Sequential`'s layers sit: the per-sample shape between layers,
each layer's parameter arrays in the model's one flat vector (and its
range there: `layer_ranges`), their initial values (`initial_vector`),
each layer's cost, and which ranges of its layers a sub-model may take
(`layer_range`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from atomr._arguments import int_at_least
from atomr.train.core.model.layer import Layer

__all__ = ["Slot", "flat_layout", "initial_vector", "layer_costs", "layer_range", "layer_ranges"]

Slot = tuple[int, int, tuple[int, ...]]
"""One parameter array: `(start, stop, shape)` in the flat vector, in Python
ints (`Sequential.views` reads them for every layer of every pass)."""


def flat_layout(
    layers: Sequence[Layer], in_shape: tuple[int, ...]
) -> tuple[list[tuple[int, ...]], list[list[Slot]], int]:
    """The layout of `layers` taking per-sample inputs of `in_shape`.

    Returns:
        The per-sample shape entering each layer, then the output's; each
        layer's arrays as `Slot`s, in its `param_shapes` order, the layers
        one after another; and the flat vector's length.

    Raises:
        ValueError: a layer that refuses the shape it is given (`out_shape`).
    """
    shape, pos = in_shape, 0
    shapes: list[tuple[int, ...]] = [shape]
    slots: list[list[Slot]] = []
    for layer in layers:
        shape = tuple(int(d) for d in layer.out_shape(shape))
        shapes.append(shape)
        own = []
        for s in layer.param_shapes():
            array_shape = tuple(int(d) for d in s)
            size = math.prod(array_shape)
            own.append((pos, pos + size, array_shape))
            pos += size
        slots.append(own)
    return shapes, slots, pos


def initial_vector(
    layers: Sequence[Layer], slots: list[list[Slot]], n_params: int, dtype: Any, rng: Any
) -> np.ndarray:
    """The flat initial vector of `layers` laid out as `slots` (`flat_layout`),
    each layer drawing from `rng` (a `np.random.Generator`) in turn.

    Raises:
        ValueError: a layer whose `init_params` does not match its `param_shapes`.
    """
    host = np.empty(n_params, dtype=dtype)
    for layer, own in zip(layers, slots, strict=True):
        arrays = layer.init_params(rng)
        if [tuple(np.shape(a)) for a in arrays] != [s for _, _, s in own]:
            raise ValueError(f"{type(layer).__name__}.init_params does not match its param_shapes")
        for (start, stop, _), a in zip(own, arrays, strict=True):
            host[start:stop] = np.asarray(a).reshape(-1)
    return host


def layer_range(start: object, stop: object, n_layers: int) -> tuple[int, int]:
    """`(start, stop)` as ints, checked to be a non-empty range of a model's
    `n_layers` layers (`slice_layers`' bounds).

    Raises:
        TypeError: a bound that is not an int (a bool or a float is none;
            NumPy's ints are).
        ValueError: a negative `start`, or not `start < stop <= n_layers`.
    """
    first, last = int_at_least("start", start, 0), int_at_least("stop", stop, 0)
    if not first < last <= n_layers:
        raise ValueError(f"need 0 <= start < stop <= {n_layers}, got {first}, {last}")
    return first, last


def layer_ranges(layers: Sequence[Layer]) -> list[tuple[int, int]]:
    """`(start, stop)` of each layer's parameters in the flat vector
    (`start == stop` for a layer without parameters)."""
    ranges, pos = [], 0
    for layer in layers:
        ranges.append((pos, pos + layer.n_params))
        pos += layer.n_params
    return ranges


def layer_costs(layers: Sequence[Layer], in_shape: tuple[int, ...]) -> list[float]:
    """Each layer's work per sample (`Layer.cost`) taking inputs of `in_shape`."""
    costs, shape = [], in_shape
    for layer in layers:
        costs.append(layer.cost(shape))
        shape = layer.out_shape(shape)
    return costs
