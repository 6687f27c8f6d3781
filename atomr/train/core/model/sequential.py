"""`Sequential`: a model made of `Layer`s over one flat parameter vector.

Layer `i`'s parameters occupy `layer_ranges()[i]` of `params`, each array in
row-major order, in the layer's `param_shapes` order; `grads` has the same
layout. The initial values are drawn layer by layer from one
`np.random.default_rng(seed)` (in float64, then cast), so a seed gives the
same model on every device and in every process.

Forward and backward run the layers' kernels on the model's device (the
backend of `atomr.accel.backend_for(device)`); call them from the device's
worker thread when the model belongs to an actor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Self

import numpy as np

from atomr._arguments import array_bytes, building, int_at_least
from atomr.accel import Device, backend_for
from atomr.train.core._cpu import cpu_backend
from atomr.train.core.model._layout import (
    flat_layout,
    initial_vector,
    layer_costs,
    layer_range,
    layer_ranges,
)
from atomr.train.core.model.inputs import (
    SEQUENTIAL_KEYS,
    known_keys,
    model_dtype,
    model_input,
    params_vector,
)
from atomr.train.core.model.layer import (
    INFERENCE,
    ForwardContext,
    Layer,
    backward_checked,
    forward_checked,
)
from atomr.train.core.model.registry import layer_from_config
from atomr.train.core.validation import check_input_batch

__all__ = ["Sequential", "SequentialTape"]

TRAIN = ForwardContext(train=True)

_VIEWED_VECTORS = 3
"""The vectors whose views `Sequential.views` keeps: gradients and two parameter sets."""


@dataclass
class SequentialTape:
    """What a training forward pass keeps for its backward pass.

    Attributes:
        saved: each layer's saved state, in order.
        output: the model's output.
    """

    saved: list[Any] = field(default_factory=list)
    output: Any = None


class Sequential:
    """Layers applied in order, their parameters in one flat vector.

    Args:
        layers: the layers (`atomr.train.core.model`'s, or your own).
        input_shape: the per-sample input shape (features `(in,)`, token
            ids `(T,)`).
        input_kind: "float" (features) or "tokens" (int ids, in
            `[0, layers[0].vocab)`: the first layer must say its vocabulary,
            as `Embedding` does).
        seed: the seed of the initialisation.
        dtype: float32 (default) or float64.
        device: where the parameters live (a `Device` or its name; default
            the CPU).

    Attributes:
        shapes: the per-sample shape entering each layer, then the output's
            (each pass checks every layer's output against it).

    Raises:
        TypeError: `seed` is not an int (a bool is none).
        ValueError: no layers, an `input_shape` that is not a non-empty list
            of positive ints, a layer that refuses its input shape or the
            dtype (`Layer.check_dtype`), an unknown input kind or dtype, token
            input into a first layer without an int `vocab`, a negative `seed`
            or parameters no array holds (`array_bytes`); checked first.
        MemoryError: too many for memory (the message names the model's bytes).
    """

    seed: int | None

    def __init__(
        self,
        layers: Sequence[Layer],
        input_shape: Sequence[int],
        *,
        input_kind: str = "float",
        seed: int = 0,
        dtype: Any = np.float32,
        device: Any = None,
    ) -> None:
        seed = int_at_least("seed", seed, 0, high=None)
        self._setup(layers, input_shape, input_kind, dtype, device)
        self._allocate(np.random.default_rng(seed))
        self.seed = seed

    # -- construction -------------------------------------------------------

    def _setup(
        self, layers: Sequence[Layer], input_shape: object, input_kind: str, dtype: Any, device: Any
    ) -> None:
        self.layers: list[Layer] = list(layers)
        if not self.layers or not all(isinstance(layer, Layer) for layer in self.layers):
            raise ValueError("a model needs a non-empty list of Layers")
        self.in_shape = model_input(self.layers[0], input_shape, input_kind)
        self.input_kind = input_kind
        self.dtype = model_dtype(dtype)
        for layer in self.layers:
            layer.check_dtype(self.dtype)
        self.device: Any = None
        self.backend: Any = cpu_backend()
        if device is not None:
            self.device = Device.parse(device)
            self.backend = backend_for(self.device)
        self.shapes, self._slots, self.n_params = flat_layout(self.layers, self.in_shape)
        what = f"{type(self).__name__} parameters and gradients ({self.n_params} {self.dtype} each)"
        self._size = (what, 2 * array_bytes(what, self.n_params, self.dtype.itemsize))
        self.out_shape: tuple[int, ...] = self.shapes[-1]
        self._views: dict[int, tuple[Any, list[list[Any]]]] = {}
        self.seed = None

    def _allocate(self, host: np.ndarray | np.random.Generator) -> None:
        """`params` (`host`, or drawn from it: `initial_vector`) and zeroed `grads`."""
        with building(*self._size):  # a MemoryError names the model and its bytes
            if isinstance(host, np.random.Generator):
                host = initial_vector(self.layers, self._slots, self.n_params, self.dtype, host)
            self.params: Any = self.backend.to_device(np.ascontiguousarray(host, dtype=self.dtype))
            self.grads: Any = self.backend.zeros((self.n_params,), dtype=self.dtype)

    @classmethod
    def from_config(cls, config: dict[str, Any], params: np.ndarray, device: Any = None) -> Self:
        """Rebuild a model from `config()` and a host parameter vector.

        Raises:
            TypeError: `params` are not real numbers.
            ValueError: a config that does not build, or `params` of the
                wrong length or not finite in the model's dtype.
        """
        model = cls._unloaded(config, device)
        model._load(params)
        return model

    @classmethod
    def _unloaded(cls, config: dict[str, Any], device: Any = None) -> Self:
        """The model `config` describes, its parameters not yet allocated
        (`from_config` loads them; `batch_spec` reads its shapes).

        Raises:
            ValueError: a config that does not build (the message says why),
                a key not in `SEQUENTIAL_KEYS` included.
        """
        known_keys("a sequential model", config, SEQUENTIAL_KEYS)
        layers = config.get("layers")
        if not isinstance(layers, list):
            raise ValueError("a sequential model config needs a 'layers' list")
        built = [layer_from_config(c) for c in layers]
        shape, kind = config.get("input_shape"), config.get("input_kind", "float")
        model = cls.__new__(cls)
        model._setup(built, shape, kind, config.get("dtype", "float32"), device)
        return model

    @classmethod
    def from_layers(
        cls,
        layers: Sequence[Layer],
        input_shape: Sequence[int],
        params: np.ndarray,
        *,
        input_kind: str = "float",
        device: Any = None,
    ) -> Sequential:
        """A model of these layers holding `params` (no initialisation drawn);
        its dtype is `params`'s.

        Raises:
            TypeError: `params` are not real numbers.
            ValueError: as for the class, or `params` of the wrong length or
                not finite (NaN or Inf).
        """
        model = cls.__new__(cls)
        model._setup(layers, input_shape, input_kind, np.asarray(params).dtype, device)
        model._load(params)
        return model

    def _load(self, params: np.ndarray) -> None:
        self._allocate(params_vector(params, self.dtype, self.n_params))

    def config(self) -> dict[str, Any]:
        """JSON-serialisable description: the layers' configs, input shape and
        kind, dtype and seed (what `from_config` and checkpoints need)."""
        return {
            "kind": "sequential",
            "layers": [layer.config() for layer in self.layers],
            "input_shape": list(self.in_shape),
            "input_kind": self.input_kind,
            "dtype": self.dtype.name,
            "seed": self.seed,
        }

    def to(self, device: Any) -> Self:
        """A copy (parameters; gradients zeroed) on `device`; this one is unchanged."""
        model = type(self).from_config(self.config(), self.get_params(), device=device)
        model.seed = self.seed
        return model

    # -- layout -------------------------------------------------------------

    @property
    def n_layers(self) -> int:
        """The top-level layers (a `Residual` block counts as one): the units
        a pipeline cuts between."""
        return len(self.layers)

    def stage_costs(self) -> list[float]:
        """The cost of each top-level layer, to balance pipeline stages."""
        return self.layer_costs()

    def stage_has_params(self) -> list[bool]:
        """Whether each top-level layer has parameters (a pipeline stage
        needs one)."""
        return [layer.n_params > 0 for layer in self.layers]

    def slice_layers(self, start: int, stop: int) -> Sequential:
        """The sub-model of top-level layers `start..stop-1` (a pipeline stage):
        their parameters (a copy), taking what layer `start` takes.

        Raises:
            TypeError: a bound that is not an int (a bool or a float is none).
            ValueError: an empty or out-of-range layer range.
        """
        start, stop = layer_range(start, stop, self.n_layers)
        shape = self.in_shape
        for layer in self.layers[:start]:
            shape = layer.out_shape(shape)
        ranges = self.layer_ranges()
        part = Sequential.__new__(Sequential)
        kind = self.input_kind if start == 0 else "float"
        part._setup(self.layers[start:stop], shape, kind, self.dtype, self.device)
        part._load(self.get_params()[ranges[start][0] : ranges[stop - 1][1]])
        return part

    def layer_ranges(self) -> list[tuple[int, int]]:
        """`(start, stop)` of each layer's parameters in the flat vector
        (`start == stop` for a layer without parameters)."""
        return layer_ranges(self.layers)

    def layer_costs(self) -> list[float]:
        """Each layer's work per sample (`Layer.cost`), to balance pipeline stages."""
        return layer_costs(self.layers, self.in_shape)

    def views(self, vector: Any, index: int) -> list[Any]:
        """Layer `index`'s arrays as views into `vector` (`params` or `grads`).

        Kept for this model's own vectors (every pass uses them): the gradients
        and two parameter sets (a double buffer's); a fourth drops them all."""
        if vector is not self.params and vector is not self.grads:
            return [vector[a:b].reshape(shape) for a, b, shape in self._slots[index]]
        return self._kept_views(vector)[index]

    def _kept_views(self, vector: Any) -> list[list[Any]]:
        """Every layer's views into `vector`, `params` or `grads` (see `views`)."""
        cached = self._views.get(id(vector))
        if cached is None or cached[0] is not vector:
            if len(self._views) >= _VIEWED_VECTORS:
                self._views.clear()
            layers = [[vector[a:b].reshape(shape) for a, b, shape in s] for s in self._slots]
            cached = self._views[id(vector)] = (vector, layers)
        return cached[1]

    def get_params(self) -> np.ndarray:
        """A host copy of the flat parameter vector."""
        return np.asarray(self.backend.to_host(self.params), dtype=self.dtype)

    def set_params(self, host: np.ndarray, *, checked: bool = True) -> None:
        """Overwrite the parameters with a host vector (copied, cast to
        `dtype`), checked (`params_vector`). `checked=False` skips the finite
        pass, for weights checked where they came in and handed on each step
        (a parameter server's pull: every update keeps its weights finite).

        Raises:
            TypeError: not real numbers (bools, complex numbers, strings).
            ValueError: wrong length, or (checked) NaN or Inf after the cast
                to `dtype`; the parameters are unchanged.
        """
        flat = params_vector(host, self.dtype, self.n_params, checked=checked)
        self.backend.upload_unchecked(flat, self.params)  # one copy: it never aliases host

    def zero_grads(self) -> None:
        """Set every gradient to 0, whatever the buffer held (NaN and
        infinities too, which scaling by 0 would keep as NaN)."""
        be = self.backend
        be.copy(be.zeros(self.grads.shape, dtype=self.grads.dtype), self.grads)

    # -- math ---------------------------------------------------------------

    def forward(self, x: Any, ctx: ForwardContext = INFERENCE) -> Any:
        """The output for a batch (keeps nothing for backward).

        Raises:
            ValueError: `x` is not `(batch, *in_shape)`.
            TypeError: a float model given no float32 / float64 (bools,
                ints, float16).
        """
        check_input_batch(x, self.in_shape, self.input_kind)
        params = self._kept_views(self.params)
        for i, layer in enumerate(self.layers):
            x, _ = forward_checked(layer, self.backend, params[i], x, ctx, self.shapes[i + 1])
        return x

    def forward_train(self, x: Any, ctx: ForwardContext = TRAIN) -> SequentialTape:
        """Forward pass that keeps what `backward` needs.

        Args:
            x: `(batch, *in_shape)` on the device (the model's dtype, or
                int64 ids), C-contiguous; the trainers validate it at their boundary.
            ctx: the step and batch offset (dropout); training by default.

        Returns:
            The tape; `tape.output` is the model output.

        Raises:
            ValueError: `x` is not `(batch, *in_shape)`.
            TypeError: a float model given no float32 / float64 (bools,
                ints, float16).
        """
        check_input_batch(x, self.in_shape, self.input_kind)
        return self.forward_train_unchecked(x, ctx)

    def forward_train_unchecked(self, x: Any, ctx: ForwardContext = TRAIN) -> SequentialTape:
        """`forward_train` for a caller that has checked `x` as it does (a
        trainer's validated batch); `x` is not looked at here."""
        tape = SequentialTape()
        params = self._kept_views(self.params)
        for i, layer in enumerate(self.layers):
            x, saved = forward_checked(layer, self.backend, params[i], x, ctx, self.shapes[i + 1])
            tape.saved.append(saved)
        tape.output = x
        return tape

    def backward(
        self,
        tape: SequentialTape,
        d_output: Any,
        *,
        accumulate: bool = False,
        input_grad: bool = False,
    ) -> Any:
        """Backward pass: the parameters' gradients into `grads`.

        Args:
            tape: from `forward_train` on this model.
            d_output: dLoss/d(output), shaped like `tape.output`, on the device.
            accumulate: add into `grads` instead of overwriting them.
            input_grad: also return dLoss/dx (a pipeline stage passes it on).

        Returns:
            dLoss/dx when `input_grad`, else None.
        """
        be, g = self.backend, d_output
        params, grads = self._kept_views(self.params), self._kept_views(self.grads)
        for i in range(len(self.layers) - 1, -1, -1):
            wants = i > 0 or input_grad
            g = backward_checked(
                self.layers[i],
                be,
                params[i],
                grads[i],
                tape.saved[i],
                g,
                accumulate,
                wants,
                self.shapes[i],
            )
        return g if input_grad else None
