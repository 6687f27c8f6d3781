"""`Mlp`: a multi-layer perceptron whose parameters live in one flat vector.

Layout (internals.md section 3): layer `l` has `W_l` of shape
`(sizes[l], sizes[l+1])` then `b_l` of shape `(sizes[l+1],)`, stored in that
order, layer after layer, in one contiguous vector `params`; `grads` has the
same layout. Layer `l` computes `z = x @ W_l + b_l` and, except for the last
layer (whose output are the logits), `a = activation(z)`.

Forward and backward run as the kernels of the model's device
(`atomr.accel.backend_for(device)`): on a CPU device they work on NumPy
arrays, on a CUDA device on numba device arrays. Call them from the device's
worker thread (`DeviceActor.on_device`) when the model belongs to an actor.

    z_l   = a_{l-1} @ W_l + b_l              dW_l   = a_{l-1}^T @ dz_l
    a_l   = f(z_l)                           db_l   = sum_rows(dz_l)
                                             da_{l-1} = dz_l @ W_l^T
                                             dz_{l-1} = da_{l-1} * f'(z_{l-1})
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from atomr.accel import ACTIVATIONS, Device, backend_for
from atomr.train.core._cpu import cpu_backend

__all__ = ["LayerOffsets", "Mlp", "Tape"]


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


@dataclass
class Tape:
    """What a training forward pass keeps for its backward pass.

    Attributes:
        inputs: the input of each layer (`x`, then each activation output).
        pre_activations: `z_l` of each layer (None where no activation follows).
        output: the model output (the last layer's `z`, or its activation).
    """

    inputs: list[Any] = field(default_factory=list)
    pre_activations: list[Any] = field(default_factory=list)
    output: Any = None


def _layout(sizes: Sequence[int]) -> list[LayerOffsets]:
    offsets = []
    pos = 0
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
        w = pos
        pos += fan_in * fan_out
        offsets.append(LayerOffsets(w, (fan_in, fan_out), pos, (fan_out,)))
        pos += fan_out
    return offsets


class Mlp:
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
        ValueError: bad sizes, activation or dtype.
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
        self._setup(sizes, activation, dtype, device, activate_last)
        rng = np.random.default_rng(seed)
        host = np.empty(self.n_params, dtype=self.dtype)
        for off in self._offsets:
            bound = 1.0 / math.sqrt(off.w_shape[0])
            n_w = off.w_shape[0] * off.w_shape[1]
            host[off.w_offset : off.w_offset + n_w] = rng.uniform(-bound, bound, size=n_w)
            host[off.b_offset : off.stop] = rng.uniform(-bound, bound, size=off.b_shape[0])
        self.seed = int(seed)
        self._allocate(host)

    # -- construction -------------------------------------------------------

    def _setup(
        self, sizes: Sequence[int], activation: str, dtype: Any, device: Any, activate_last: bool
    ) -> None:
        sizes = [int(s) for s in sizes]
        if len(sizes) < 2 or any(s < 1 for s in sizes):
            raise ValueError(f"sizes must have >= 2 entries, each >= 1; got {sizes}")
        if not isinstance(activation, str) or activation not in ACTIVATIONS:
            raise ValueError(
                f"unknown activation {activation!r}; expected one of {tuple(ACTIVATIONS)}"
            )
        try:
            dt = np.dtype(dtype)
        except TypeError as exc:
            raise ValueError(f"dtype must be float32 or float64, got {dtype!r}") from exc
        if dt not in (np.float32, np.float64):
            raise ValueError(f"dtype must be float32 or float64, got {dt}")
        if device is None:
            self.device: Any = None
            self.backend: Any = cpu_backend()
        else:
            self.device = Device.parse(device)
            self.backend = backend_for(self.device)
        self.sizes: tuple[int, ...] = tuple(sizes)
        self.activation = activation
        self.dtype = dt
        self.activate_last = bool(activate_last)
        self._offsets = _layout(self.sizes)
        self.n_params = self._offsets[-1].stop
        # per layer: where W and b sit, and the activation code that follows (None: none)
        self._slices = [
            (slice(o.w_offset, o.b_offset), o.w_shape, slice(o.b_offset, o.stop))
            for o in self._offsets
        ]
        last = len(self._offsets) - 1
        code = None if activation == "identity" else ACTIVATIONS[activation]
        self._codes = [code if k < last or self.activate_last else None for k in range(last + 1)]
        self.seed = None  # None when built from given parameters

    def _allocate(self, host: np.ndarray) -> None:
        self.params: Any = self.backend.to_device(np.ascontiguousarray(host, dtype=self.dtype))
        self.grads: Any = self.backend.zeros((self.n_params,), dtype=self.dtype)

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
            ValueError: bad sizes/activation/dtype, or `params` of the wrong length.
        """
        model = cls.__new__(cls)
        model._setup(sizes, activation, dtype, device, activate_last)
        flat = np.asarray(params).reshape(-1)
        if flat.shape[0] != model.n_params:
            raise ValueError(f"params has {flat.shape[0]} values, sizes need {model.n_params}")
        model._allocate(flat)
        return model

    @classmethod
    def wrap(
        cls,
        sizes: Sequence[int],
        params: Any,
        grads: Any,
        activation: str = "relu",
        *,
        device: Any = None,
        activate_last: bool = False,
    ) -> Mlp:
        """A model over buffers already on `device`, without a copy (a
        gathered layer of a sharded replica).

        Args:
            sizes, activation, device, activate_last: as for `Mlp`.
            params: the flat parameters in the device's memory; their dtype
                is the model's.
            grads: a gradient buffer like `params`, or None (forward only).

        Returns:
            The model; it reads and writes the given buffers.

        Raises:
            ValueError: bad sizes/activation, or buffers of the wrong length.
        """
        model = cls.__new__(cls)
        model._setup(sizes, activation, params.dtype, device, activate_last)
        for name, buffer in (("params", params), ("grads", grads)):
            if buffer is not None and tuple(buffer.shape) != (model.n_params,):
                raise ValueError(
                    f"{name} has shape {tuple(buffer.shape)}, sizes need ({model.n_params},)"
                )
        model.params, model.grads = params, grads
        return model

    @classmethod
    def from_config(cls, config: dict[str, Any], params: np.ndarray, device: Any = None) -> Mlp:
        """Rebuild a model from `config()` and a host parameter vector.

        Raises:
            ValueError: as `from_params`.
        """
        return cls.from_params(
            config["sizes"],
            params,
            config.get("activation", "relu"),
            dtype=config.get("dtype", "float32"),
            device=device,
            activate_last=bool(config.get("activate_last", False)),
        )

    @staticmethod
    def param_count(sizes: Sequence[int]) -> int:
        """Number of parameters of an MLP with these sizes (sum of in*out + out)."""
        return sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:], strict=True))

    def config(self) -> dict[str, Any]:
        """JSON-serialisable description: sizes, activation, dtype, activate_last, seed."""
        return {
            "sizes": list(self.sizes),
            "activation": self.activation,
            "dtype": self.dtype.name,
            "activate_last": self.activate_last,
            "seed": self.seed,
        }

    def to(self, device: Any) -> Mlp:
        """A copy of this model (parameters; gradients zeroed) on `device`.

        Args:
            device: a `Device` or its name.

        Returns:
            The new model; this one is unchanged.
        """
        model = Mlp.from_config(self.config(), self.get_params(), device=device)
        model.seed = self.seed
        return model

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
            ValueError: empty or out-of-range layer range.
        """
        if not 0 <= start < stop <= self.n_layers:
            raise ValueError(f"need 0 <= start < stop <= {self.n_layers}, got {start}, {stop}")
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

    def get_params(self) -> np.ndarray:
        """A host copy of the flat parameter vector."""
        return np.asarray(self.backend.to_host(self.params), dtype=self.dtype)

    def set_params(self, host: np.ndarray) -> None:
        """Overwrite the parameters with a host vector (copied, cast to `dtype`).

        Raises:
            ValueError: wrong length.
        """
        flat = np.ascontiguousarray(np.asarray(host).reshape(-1), dtype=self.dtype)
        if flat.shape[0] != self.n_params:
            raise ValueError(f"got {flat.shape[0]} values, the model has {self.n_params}")
        self.backend.copy(self.backend.to_device(flat), self.params)

    def zero_grads(self) -> None:
        """Set every gradient to 0."""
        self.backend.scale(self.grads, 0.0)

    # -- math ---------------------------------------------------------------

    def forward(self, x: Any) -> Any:
        """Inference: the model output for a batch (keeps nothing for backward).

        Args:
            x: `(batch, in_width)` in the device's memory, of `dtype`.

        Returns:
            `(batch, out_width)` output in the device's memory.
        """
        return self.forward_train(x).output

    def forward_train(self, x: Any) -> Tape:
        """Forward pass that keeps what `backward` needs.

        The model's own buffers go to the backend's unchecked kernels
        (`Backend` docstring): `x` is the one input it does not make, so it
        must be what `Mlp` documents (the trainers validate it at their
        boundary).

        Args:
            x: `(batch, in_width)` in the device's memory, of `dtype`, C-contiguous.

        Returns:
            The `Tape`; `tape.output` is the model output.
        """
        be = self.backend
        tape = Tape()
        a = x
        batch = x.shape[0]
        for layer, code in enumerate(self._codes):
            w, b = self._layer(self.params, layer)
            tape.inputs.append(a)
            z = be.empty((batch, w.shape[1]), dtype=self.dtype)
            be.matmul_unchecked(a, w, z, False, False, False)
            be.bias_add_unchecked(z, b)
            if code is not None:
                a = be.empty(z.shape, dtype=self.dtype)
                be.activation_forward_unchecked(code, z.reshape(-1), a.reshape(-1))
                tape.pre_activations.append(z)
            else:
                a = z
                tape.pre_activations.append(None)
        tape.output = a
        return tape

    def backward(
        self, tape: Tape, d_output: Any, *, accumulate: bool = False, input_grad: bool = False
    ) -> Any:
        """Backward pass: gradients of the parameters into `grads`.

        Args:
            tape: from `forward_train` on this model.
            d_output: dLoss/d(output), shaped like `tape.output`, device memory,
                C-contiguous (it goes to the unchecked kernels, as in `forward_train`).
            accumulate: add into `grads` instead of overwriting them.
            input_grad: also compute dLoss/dx (a pipeline stage passes it on).

        Returns:
            dLoss/dx `(batch, in_width)` when `input_grad`, else None.
        """
        be = self.backend
        acc = bool(accumulate)
        dz = d_output
        for layer in range(len(self._codes) - 1, -1, -1):
            z = tape.pre_activations[layer]
            if z is not None:
                dz_pre = be.empty(z.shape, dtype=self.dtype)
                be.activation_backward_unchecked(
                    self._codes[layer], z.reshape(-1), dz.reshape(-1), dz_pre.reshape(-1)
                )
                dz = dz_pre
            gw, gb = self._layer(self.grads, layer)
            be.matmul_unchecked(tape.inputs[layer], dz, gw, True, False, acc)
            be.bias_grad_unchecked(dz, gb, acc)
            if layer > 0 or input_grad:
                w = self._layer(self.params, layer)[0]
                da = be.empty((dz.shape[0], w.shape[0]), dtype=self.dtype)
                be.matmul_unchecked(dz, w, da, False, True, False)
                dz = da
        return dz if input_grad else None
