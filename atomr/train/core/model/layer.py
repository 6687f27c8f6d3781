"""`Layer`: the protocol every layer of a model follows, and `ForwardContext`.

A model is a sequence of layers over one flat parameter vector
(`Sequential`): a layer declares the shapes of its parameters and how to
initialise them (seeded), and computes on *views* into the flat vector, so
all-reduce, broadcast, optimizer steps and checkpoints stay one operation on
one vector whatever the model. A layer owns no buffers.

Shapes are per sample: `out_shape(in_shape)` excludes the batch axis.
Arrays passed to `forward` / `backward` are the device's (the backend's
memory), C-contiguous, of the model's dtype (token ids: int64).

To write a layer: subclass `Layer`, give it a `kind` (its name in configs),
register it (`atomr.train.core.model.register_layer`), and implement the
abstract methods. A layer whose hyperparameters depend on the dtype it
computes in (`LayerNorm`'s `eps`) checks them in `check_dtype`, which the
model calls once its dtype is known, before it allocates anything.
`tests/train/core/model/test_layers.py` checks every
built-in layer against float64 finite differences; do the same for yours
(`atomr.train.core.model.gradient_check`).
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

__all__ = ["ForwardContext", "Layer", "backward_checked", "forward_checked"]


@dataclass(frozen=True)
class ForwardContext:
    """What a forward pass may depend on besides its input.

    Attributes:
        train: a training pass (dropout active, the backward will follow).
        step: the optimizer step this pass belongs to.
        sample_offset: the index of the input's first row in the whole
            batch (a replica, micro-batch or shard holding rows `lo:hi` says
            `lo`), so that per-sample randomness equals one device's.
    """

    train: bool = True
    step: int = 0
    sample_offset: int = 0


INFERENCE = ForwardContext(train=False)
"""The context of an evaluation pass."""


class Layer(abc.ABC):
    """One layer of a model (module docstring).

    Subclasses set `kind`.
    """

    kind: ClassVar[str] = ""

    def param_shapes(self) -> list[tuple[int, ...]]:
        """The shapes of the layer's parameters, in storage order (none by default)."""
        return []

    def init_params(self, rng: np.random.Generator) -> list[np.ndarray]:
        """Initial values (float64), one per `param_shapes` entry, drawn from `rng`.

        Raises:
            NotImplementedError: a layer with parameters that does not say.
        """
        if self.param_shapes():
            raise NotImplementedError(f"{type(self).__name__} must define init_params")
        return []

    @property
    def n_params(self) -> int:
        """How many parameters the layer holds."""
        return sum(math.prod(int(d) for d in s) for s in self.param_shapes())  # exact ints

    @abc.abstractmethod
    def out_shape(self, in_shape: tuple[int, ...]) -> tuple[int, ...]:
        """The per-sample output shape for a per-sample input shape.

        Raises:
            ValueError: the layer cannot take such an input.
        """

    @abc.abstractmethod
    def forward(self, be: Any, params: list[Any], x: Any, ctx: ForwardContext) -> tuple[Any, Any]:
        """The output for a batch, and what `backward` will need.

        Args:
            be: the device's backend.
            params: views of the layer's parameters (`param_shapes` order).
            x: the input, `(batch, *in_shape)`.
            ctx: train or not, the step and the batch offset.

        Returns:
            `(y, saved)`; `saved` is only read by this layer's `backward`.
        """

    @abc.abstractmethod
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
        """Parameter gradients into `grads` and, when asked, the input gradient.

        Args:
            be, params: as for `forward`.
            grads: views of the parameters' gradients (written, or added to
                with `accumulate`).
            saved: what `forward` returned with the output.
            dy: dLoss/dy, shaped like the output.
            accumulate: add into `grads` instead of overwriting them.
            input_grad: compute dLoss/dx.

        Returns:
            dLoss/dx when `input_grad`, else None.
        """

    def check_dtype(self, dtype: np.dtype[Any]) -> None:
        """Check that the layer can compute in `dtype` (float32 or float64),
        the model's; a model calls it when it is built, before it allocates
        anything. Nothing to check by default.

        Raises:
            ValueError: a hyperparameter the layer cannot compute with in
                `dtype` (a subclass's: the default raises nothing).
        """
        return None

    def cost(self, in_shape: tuple[int, ...]) -> float:
        """Work per sample (multiply-adds), to balance pipeline stages."""
        return float(self.n_params)

    @abc.abstractmethod
    def config(self) -> dict[str, Any]:
        """A JSON-serialisable description with `"kind"`; `layer_from_config`
        rebuilds the layer from it."""


def forward_checked(
    layer: Layer,
    be: Any,
    params: list[Any],
    x: Any,
    ctx: ForwardContext,
    out_shape: tuple[int, ...],
) -> tuple[Any, Any]:
    """`layer.forward`, its output checked to be `(batch, *out_shape)`: a
    kernel downstream sizes its loops by the arrays it is given, so a layer
    returning the wrong shape would make it read or write out of bounds.

    Raises:
        ValueError: the output has another shape (naming the layer).
    """
    y, saved = layer.forward(be, params, x, ctx)
    _check_shape(layer, "forward", y, x.shape[0], out_shape)
    return y, saved


def backward_checked(
    layer: Layer,
    be: Any,
    params: list[Any],
    grads: list[Any],
    saved: Any,
    dy: Any,
    accumulate: bool,
    input_grad: bool,
    in_shape: tuple[int, ...],
) -> Any:
    """`layer.backward`, its input gradient (when asked) checked to be
    `(batch, *in_shape)` (see `forward_checked`).

    Raises:
        ValueError: the input gradient is missing or has another shape.
    """
    dx = layer.backward(be, params, grads, saved, dy, accumulate, input_grad)
    if input_grad:
        _check_shape(layer, "backward", dx, dy.shape[0], in_shape)
    return dx


def _check_shape(layer: Layer, method: str, got: Any, rows: int, sample: tuple[int, ...]) -> None:
    shape = getattr(got, "shape", None)
    if shape is not None and shape[1:] == sample and shape[0] == rows:
        return
    what = f"shape {tuple(shape)}" if shape is not None else type(got).__name__
    raise ValueError(
        f"{type(layer).__name__}.{method} returned {what}, expected shape {(int(rows), *sample)}"
    )
