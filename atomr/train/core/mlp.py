"""`Mlp`: a multi-layer perceptron, the `Sequential` of `Linear` and
`Activation` layers that atomr has always trained.

Layout (internals.md section 3): layer `l` has `W_l` of shape
`(sizes[l], sizes[l+1])` then `b_l` of shape `(sizes[l+1],)`, stored in that
order, layer after layer, in one contiguous vector `params`; `grads` has the
same layout. Layer `l` computes `z = x @ W_l + b_l` and, except for the last
layer (whose output are the logits), `a = activation(z)`.

It is a `Sequential` (`atomr.train.core.model`): forward and backward are
the layers', which run the kernels the MLP always ran, in the same order,
so its numbers are unchanged. Forward and backward run as the kernels of the
model's device (`atomr.accel.backend_for(device)`): on a CPU device they
work on NumPy arrays, on a CUDA device on numba device arrays. Call them
from the device's worker thread (`DeviceActor.on_device`) when the model
belongs to an actor. Its config keeps the MLP's own keys (sizes, activation,
dtype, activate_last, seed), so its checkpoints are what they always were.

    z_l   = a_{l-1} @ W_l + b_l              dW_l   = a_{l-1}^T @ dz_l
    a_l   = f(z_l)                           db_l   = sum_rows(dz_l)
                                             da_{l-1} = dz_l @ W_l^T
                                             dz_{l-1} = da_{l-1} * f'(z_{l-1})
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Self

import numpy as np

from atomr._arguments import bool_flag, int_at_least
from atomr.accel import ACTIVATIONS
from atomr.actor.errors import bounded_repr
from atomr.train.core.model._layout import layer_range
from atomr.train.core.model.inputs import MLP_KEYS, known_keys, positive_ints
from atomr.train.core.model.layer import Layer
from atomr.train.core.model.linear import Activation, Linear
from atomr.train.core.model.sequential import Sequential

__all__ = ["LayerOffsets", "Mlp"]


@dataclass(frozen=True, slots=True)
class LayerOffsets:
    """Where one layer's parameters sit in the flat vector.

    Attributes:
        w_offset: index of `W[0, 0]`; `W` occupies `w_offset : w_offset + in*out`
            in row-major `(in, out)` order.
        w_shape: `(in, out)`.
        b_offset: index of `b[0]`; `b` occupies `b_offset : b_offset + out`.
        b_shape: `(out,)`.
    """

    w_offset: int
    w_shape: tuple[int, int]
    b_offset: int
    b_shape: tuple[int]

    @property
    def stop(self) -> int:
        """One past the layer's last parameter (`b_offset + out`)."""
        return self.b_offset + self.b_shape[0]


def _widths(sizes: object) -> tuple[int, ...]:
    """`sizes` as a tuple of at least two positive ints.

    Raises:
        ValueError: anything else (the message names the entry).
    """
    widths = positive_ints("sizes", sizes)
    if len(widths) < 2:
        raise ValueError(f"sizes must have >= 2 entries, got {list(widths)}")
    return widths


def _layout(sizes: Sequence[int]) -> list[LayerOffsets]:
    offsets = []
    pos = 0
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
        w = pos
        pos += fan_in * fan_out
        offsets.append(LayerOffsets(w, (fan_in, fan_out), pos, (fan_out,)))
        pos += fan_out
    return offsets


class Mlp(Sequential):
    """A multi-layer perceptron with flat parameters on one device.

    Args:
        sizes: layer widths, input first: `[in, hidden..., out]`, at least
            two entries, each >= 1.
        activation: "relu", "tanh", "gelu" (tanh approximation) or "identity".
        seed: seed of the initialisation; `np.random.default_rng(seed)`
            draws `W_l` then `b_l`, layer by layer, from
            `uniform(-1/sqrt(fan_in), 1/sqrt(fan_in))` (in float64, then cast).
        dtype: float32 (default) or float64 (the CPU backend accepts float64,
            used for finite-difference gradient checks).
        device: where the parameters live and the kernels run (a `Device` or
            its name); default "cpu:0".
        activate_last: apply the activation after the last layer too (used by
            pipeline stages that are not the model's final one).

    Raises:
        TypeError: `seed` is not an int (a bool is none).
        ValueError: `sizes` not a list of at least two positive ints (a bool
            or a float is not; the message names the entry), an unknown
            activation or dtype, an `activate_last` that is not a bool, a
            negative `seed`, or more parameters than an array holds
            (`_arguments.array_bytes`); checked before any parameter is drawn.
        MemoryError: too many for memory (the message names the model's bytes).
    """

    seed: int | None

    def __init__(
        self,
        sizes: Sequence[int],
        activation: str = "relu",
        seed: int = 0,
        *,
        dtype: Any = np.float32,
        device: Any = None,
        activate_last: bool = False,
    ) -> None:
        seed = int_at_least("seed", seed, 0, high=None)
        self._setup_mlp(sizes, activation, dtype, device, activate_last)
        self._allocate(np.random.default_rng(seed))
        self.seed = seed

    # -- construction -------------------------------------------------------

    def _setup_mlp(
        self, sizes: Sequence[int], activation: str, dtype: Any, device: Any, activate_last: bool
    ) -> None:
        self.sizes: tuple[int, ...] = _widths(sizes)
        if not isinstance(activation, str) or activation not in ACTIVATIONS:
            raise ValueError(
                f"unknown activation {bounded_repr(activation)}; "
                f"expected one of {tuple(ACTIVATIONS)}"
            )
        try:
            self.activate_last = bool_flag("activate_last", activate_last)
        except TypeError as exc:  # a model config that does not build is a ValueError
            raise ValueError(str(exc)) from None
        self.activation = activation
        self._offsets = _layout(self.sizes)
        # per layer: where W and b sit
        self._slices = [
            (slice(o.w_offset, o.b_offset), o.w_shape, slice(o.b_offset, o.stop))
            for o in self._offsets
        ]
        layers: list[Layer] = []
        last = len(self._offsets) - 1
        for k, (fan_in, fan_out) in enumerate(zip(self.sizes[:-1], self.sizes[1:], strict=True)):
            layers.append(Linear(fan_in, fan_out))
            if activation != "identity" and (k < last or self.activate_last):
                layers.append(Activation(activation))
        self._setup(layers, (self.sizes[0],), "float", dtype, device)

    @classmethod
    def from_params(
        cls,
        sizes: Sequence[int],
        params: np.ndarray,
        activation: str = "relu",
        *,
        dtype: Any = np.float32,
        device: Any = None,
        activate_last: bool = False,
    ) -> Mlp:
        """Build a model with given parameters instead of a seeded init.

        Args:
            sizes, activation, dtype, device, activate_last: as for `Mlp`.
            params: host vector of `Mlp.param_count(sizes)` values (copied).

        Returns:
            The model, its gradients zeroed.

        Raises:
            TypeError: `params` are not real numbers.
            ValueError: as for `Mlp`, or `params` of the wrong length or
                not finite in `dtype` (NaN, Inf, too large for it).
        """
        model = cls.__new__(cls)
        model._setup_mlp(sizes, activation, dtype, device, activate_last)
        model._load(params)
        return model

    @classmethod
    def _unloaded(cls, config: dict[str, Any], device: Any = None) -> Self:
        """The model `config()` describes, its parameters not yet allocated
        (`from_config` loads them).

        Raises:
            ValueError: no `sizes`, a key not in `MLP_KEYS`, or a value
                `from_params` refuses.
        """
        if "sizes" not in config:
            raise ValueError(
                "a model config needs 'sizes' (an Mlp's) or 'layers' (a Sequential's); "
                f"it has {bounded_repr(list(config))}"
            )
        known_keys("an Mlp", config, MLP_KEYS)
        model = cls.__new__(cls)
        model._setup_mlp(
            config["sizes"],
            config.get("activation", "relu"),
            config.get("dtype", "float32"),
            device,
            config.get("activate_last", False),
        )
        return model

    @staticmethod
    def param_count(sizes: Sequence[int]) -> int:
        """Number of parameters of an MLP with these sizes (sum of in*out + out).

        Raises:
            ValueError: `sizes` not a list of at least two positive ints, as
                for `Mlp` (a negative size counted negative parameters).
        """
        widths = _widths(sizes)
        return sum(a * b + b for a, b in zip(widths[:-1], widths[1:], strict=True))

    def config(self) -> dict[str, Any]:
        """JSON-serialisable description: sizes, activation, dtype, activate_last, seed."""
        return {
            "sizes": list(self.sizes),
            "activation": self.activation,
            "dtype": self.dtype.name,
            "activate_last": self.activate_last,
            "seed": self.seed,
        }

    def slice_layers(self, start: int, stop: int) -> Mlp:
        """The sub-model made of layers `start..stop-1` (a pipeline stage).

        Its `params` equal `params[layer_offsets()[start].w_offset :
        layer_offsets()[stop-1].stop]` (a copy, on the same device). Its last
        layer keeps the activation unless it is this model's final layer.

        Args:
            start: first layer, `0 <= start < stop`.
            stop: one past the last layer, `<= n_layers`.

        Returns:
            The sub-model.

        Raises:
            TypeError: a bound that is not an int (a bool or a float is none).
            ValueError: an empty or out-of-range layer range.
        """
        start, stop = layer_range(start, stop, self.n_layers)
        lo = self._offsets[start].w_offset
        hi = self._offsets[stop - 1].stop
        host = self.get_params()[lo:hi]
        return Mlp.from_params(
            self.sizes[start : stop + 1],
            host,
            self.activation,
            dtype=self.dtype,
            device=self.device,
            activate_last=self.activate_last if stop == self.n_layers else True,
        )

    # -- layout -------------------------------------------------------------

    @property
    def n_layers(self) -> int:
        """Number of linear layers (`len(sizes) - 1`)."""
        return len(self.sizes) - 1

    @property
    def in_width(self) -> int:
        """Input width (`sizes[0]`)."""
        return self.sizes[0]

    @property
    def out_width(self) -> int:
        """Output width (`sizes[-1]`)."""
        return self.sizes[-1]

    def stage_costs(self) -> list[float]:
        """Each linear layer's parameter count, to balance pipeline stages."""
        return [float(o.stop - o.w_offset) for o in self._offsets]

    def stage_has_params(self) -> list[bool]:
        """Every linear layer has parameters."""
        return [True] * self.n_layers

    def layer_offsets(self) -> list[LayerOffsets]:
        """Offsets and shapes of each layer's `W` and `b` in the flat vector.

        Returns:
            One `LayerOffsets` per layer, in order; tensor-parallel sharding
            slices `W` by columns within `w_offset : b_offset`.
        """
        return list(self._offsets)

    def _layer(self, vector: Any, layer: int) -> tuple[Any, Any]:
        """Layer `layer`'s `(W, b)`: views into `vector` (`params` or `grads`)."""
        w, shape, b = self._slices[layer]
        return vector[w].reshape(shape), vector[b]

    def weights(self, layer: int) -> Any:
        """`W_layer`, a `(in, out)` view into `params`."""
        return self._layer(self.params, layer)[0]

    def bias(self, layer: int) -> Any:
        """`b_layer`, a `(out,)` view into `params`."""
        return self._layer(self.params, layer)[1]

    def grad_weights(self, layer: int) -> Any:
        """dLoss/dW_layer, a `(in, out)` view into `grads`."""
        return self._layer(self.grads, layer)[0]

    def grad_bias(self, layer: int) -> Any:
        """dLoss/db_layer, a `(out,)` view into `grads`."""
        return self._layer(self.grads, layer)[1]
