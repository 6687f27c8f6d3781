"""Where a `Sequential`'s layers sit: the per-sample shape between layers,
each layer's parameter arrays in the model's one flat vector (and its
range there: `layer_ranges`), each layer's cost, and which ranges of its
layers a sub-model may take (`layer_range`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from atomr._arguments import int_at_least
from atomr.train.core.model.layer import Layer

__all__ = ["Slot", "flat_layout", "layer_costs", "layer_range", "layer_ranges"]

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
