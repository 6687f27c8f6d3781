"""Stage 3's forward and backward, one gathered layer at a time, on a replica's
device thread.

The trainer drives the passes (`sharded/_passes.py`): before a layer runs,
each replica hands over a buffer of the layer's length holding its own part
(`hand_params`), the trainer all-gathers it, and the replica runs the layer
(`Layer.forward` / `backward` over views of that buffer, no copy), then
drops it. The forward keeps each layer's saved state; the backward gathers
each layer again, writes the layer's gradient sum into a fresh buffer of its
own and hands it over for the reduce-scatter. A layer without parameters
gathers nothing. Any `Sequential` works: its top-level layers are the units.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from atomr.train.core._step_checks import check_loss
from atomr.train.core.config import TrainerConfig
from atomr.train.core.model.layer import (
    ForwardContext,
    Layer,
    backward_checked,
    forward_checked,
)
from atomr.train.core.model.sequential import Sequential
from atomr.train.sharded.layout import ShardLayout
from atomr.train.sharded.messages import BackwardLayer, ForwardLayer, Handed, LayerForwardResult

__all__ = ["LayerOwner", "LayerRunner"]


class LayerOwner(Protocol):
    """What `LayerRunner` needs of its replica (`ShardedReplica`)."""

    layout: ShardLayout
    index: int
    piece: Any
    config: TrainerConfig
    steps: int

    @property
    def backend(self) -> Any: ...

    def hand(self, buffer: Any, unit: int | None = None) -> Handed: ...


def _views(layer: Layer, buffer: Any) -> list[Any]:
    """The layer's parameter arrays as views of its flat (gathered) buffer."""
    views, at = [], 0
    for shape in layer.param_shapes():
        size = int(np.prod(shape))
        views.append(buffer[at : at + size].reshape(shape))
        at += size
    return views


class LayerRunner:
    """One stage-3 replica's passes (module docstring).

    Args:
        replica: the replica (its piece, layout, backend, loss, steps).
        template: the model (its layers).
    """

    def __init__(self, replica: LayerOwner, template: Sequential) -> None:
        self.replica = replica
        self.layers = template.layers
        self.shapes = template.shapes
        self._gathered: Any = None
        self._saved: dict[int, Any] = {}
        self._activation: Any = None
        self._d_out: Any = None
        self._ctx = ForwardContext()
        self._rows = 0

    def hand_params(self, layer: int) -> Handed:
        """A fresh buffer of layer `layer`'s length with this replica's part
        written (the rest is filled by the all-gather), handed over.

        Raises:
            ValueError: no such layer.
        """
        r = self.replica
        if not 0 <= layer < len(self.layers):
            raise ValueError(f"layer must be in [0, {len(self.layers)}), got {layer}")
        start, stop = r.layout.units[layer]
        lo, hi = r.layout.owned(r.index)[layer]
        at = r.layout.piece_offsets(r.index)[layer]
        buffer = r.backend.empty((stop - start,), dtype=r.piece.dtype)
        if hi > lo:
            r.backend.copy(r.piece[at : at + hi - lo], buffer[lo - start : hi - start])
        r.backend.synchronize()
        self._gathered = buffer
        return r.hand(buffer)

    def _params(self, layer: int, gathered: np.ndarray | None) -> list[Any]:
        """Layer `layer`'s arrays over the gathered buffer (then dropped)."""
        params = self._gathered
        if gathered is not None:  # the handed buffer was a copy: the gathered one comes back
            params = self.replica.backend.to_device(
                np.ascontiguousarray(gathered, dtype=params.dtype)
            )
        self._gathered = None  # freed after this layer
        return _views(self.layers[layer], params)

    def forward(self, msg: ForwardLayer) -> LayerForwardResult | None:
        """Run layer `msg.layer` forward; the last layer computes the loss.

        Returns:
            The shard's loss sums at the last layer, else None.

        Raises:
            ValueError: no parameters gathered.
            NonFiniteError: the loss is not finite (training; nothing changed).
        """
        r, layer = self.replica, msg.layer
        if self._gathered is None:
            raise ValueError(f"layer {layer}: its parameters were not gathered first")
        params = self._params(layer, msg.gathered)
        be = r.backend
        if layer == 0:
            assert msg.features is not None
            self._saved.clear()
            self._ctx = ForwardContext(msg.train, r.steps, msg.sample_offset)
            self._rows = int(msg.features.shape[0])
            self._activation = be.to_device(msg.features) if self._rows else None
        if self._rows:
            y, saved = forward_checked(
                self.layers[layer], be, params, self._activation, self._ctx, self.shapes[layer + 1]
            )
            if msg.train:
                self._saved[layer] = saved
            self._activation = y
        if layer < len(self.layers) - 1:
            return None
        return self._loss(msg)

    def _loss(self, msg: ForwardLayer) -> LayerForwardResult:
        r, be = self.replica, self.replica.backend
        out, self._activation = self._activation, None
        if not self._rows:
            return LayerForwardResult(0.0, 0.0, 0, 0)
        assert msg.labels is not None
        d_out = be.empty(out.shape, dtype=out.dtype)
        loss_sum, norm = r.config.loss.sums(be, out, be.to_device(msg.labels), d_out)
        correct = 0
        if msg.train:
            check_loss(loss_sum)
            self._d_out = d_out
        elif r.config.loss.is_classification:
            correct = int(np.sum(np.argmax(be.to_host(out), axis=-1) == msg.labels))
        return LayerForwardResult(float(loss_sum), float(norm), correct, self._rows)

    def backward(self, msg: BackwardLayer) -> Handed:
        """Run layer `msg.layer` backward; hand over its gradient sum.

        Raises:
            ValueError: no parameters gathered, or no forward pass kept.
        """
        r, layer = self.replica, msg.layer
        if self._gathered is None:
            raise ValueError(f"layer {layer}: its parameters were not gathered first")
        start, stop = r.layout.units[layer]
        grads = r.backend.zeros((stop - start,), dtype=r.piece.dtype)
        params = self._params(layer, msg.gathered)
        if self._rows:
            if layer not in self._saved or self._d_out is None:
                raise ValueError(f"layer {layer}: no forward pass to take the gradient of")
            saved = self._saved.pop(layer)
            gviews = _views(self.layers[layer], grads)
            self._d_out = backward_checked(
                self.layers[layer],
                r.backend,
                params,
                gviews,
                saved,
                self._d_out,
                False,
                layer > 0,
                self.shapes[layer],
            )
        r.backend.synchronize()
        return r.hand(grads, unit=layer)
