"""Stage 3's forward and backward, one gathered layer at a time, on a replica's
device thread.

The trainer drives the passes (`sharded/_layered.py`): before a layer runs,
each replica hands over a buffer of the layer's length holding its own part
(`hand_params`), the trainer all-gathers it, and the replica runs the layer
on the whole of it (an `Mlp` of one layer over the buffer, no copy), then
drops it. The forward keeps each layer's `Tape`; the backward gathers each
layer again, writes the layer's gradient sum into a fresh buffer of its own
and hands it over for the reduce-scatter.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from atomr.train.core.config import TrainerConfig
from atomr.train.core.mlp import Mlp
from atomr.train.core.model.sequential import SequentialTape as Tape
from atomr.train.core.step_checks import check_loss
from atomr.train.sharded.layout import ShardLayout
from atomr.train.sharded.messages import BackwardLayer, ForwardLayer, Handed, LayerForwardResult

__all__ = ["LayerOwner", "LayerRunner"]


class LayerOwner(Protocol):
    """What `LayerRunner` needs of its replica (`ShardedReplica`)."""

    layout: ShardLayout
    index: int
    piece: Any
    config: TrainerConfig

    @property
    def backend(self) -> Any: ...

    @property
    def device(self) -> Any: ...

    def hand(self, buffer: Any, unit: int | None = None) -> Handed: ...


class LayerRunner:
    """One stage-3 replica's passes (module docstring).

    Args:
        replica: the replica (its piece, layout, backend, loss).
        template: the model (sizes, activation, dtype).
    """

    def __init__(self, replica: LayerOwner, template: Mlp) -> None:
        self.replica = replica
        self.sizes = template.sizes
        self.activation = template.activation
        self.activate_last = template.activate_last
        self.n_layers = template.n_layers
        self._gathered: Any = None
        self._tapes: dict[int, Tape] = {}
        self._activation: Any = None
        self._labels: Any = None
        self._d_out: Any = None
        self._rows = 0

    def hand_params(self, layer: int) -> Handed:
        """A fresh buffer of layer `layer`'s length with this replica's part
        written (the rest is filled by the all-gather), handed over.

        Raises:
            ValueError: no such layer.
        """
        r = self.replica
        if not 0 <= layer < self.n_layers:
            raise ValueError(f"layer must be in [0, {self.n_layers}), got {layer}")
        start, stop = r.layout.units[layer]
        lo, hi = r.layout.owned(r.index)[layer]
        at = r.layout.piece_offsets(r.index)[layer]
        buffer = r.backend.empty((stop - start,), dtype=r.piece.dtype)
        r.backend.copy(r.piece[at : at + hi - lo], buffer[lo - start : hi - start])
        r.backend.synchronize()
        self._gathered = buffer
        return r.hand(buffer)

    def _layer_model(self, layer: int, gathered: np.ndarray | None, grads: Any = None) -> Mlp:
        """Layer `layer` as a one-layer `Mlp` over the gathered parameters."""
        r = self.replica
        params = self._gathered
        if gathered is not None:  # the handed buffer was a copy: the gathered one comes back
            params = r.backend.to_device(np.ascontiguousarray(gathered, dtype=params.dtype))
        self._gathered = None  # freed after this layer
        last = layer == self.n_layers - 1
        return Mlp.wrap(
            self.sizes[layer : layer + 2],
            params,
            grads,
            self.activation,
            device=r.device,
            activate_last=self.activate_last if last else True,
        )

    def forward(self, msg: ForwardLayer) -> LayerForwardResult | None:
        """Run layer `msg.layer` forward; the last layer computes the loss.

        Returns:
            The shard's loss sums at the last layer, else None.

        Raises:
            ValueError: a layer out of order, or no parameters gathered.
            NonFiniteError: the loss is not finite (training; nothing changed).
        """
        r, layer = self.replica, msg.layer
        if self._gathered is None:
            raise ValueError(f"layer {layer}: its parameters were not gathered first")
        model = self._layer_model(layer, msg.gathered)
        be = r.backend
        if layer == 0:
            assert msg.features is not None
            self._tapes.clear()
            self._rows = int(msg.features.shape[0])
            self._activation = be.to_device(msg.features) if self._rows else None
        if self._rows:
            tape = model.forward_train(self._activation)
            if msg.train:
                self._tapes[layer] = tape
            self._activation = tape.output
        if layer < self.n_layers - 1:
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
            correct = int(np.sum(np.argmax(be.to_host(out), axis=1) == msg.labels))
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
        model = self._layer_model(layer, msg.gathered, grads)
        if self._rows:
            tape = self._tapes.pop(layer, None)
            if tape is None or self._d_out is None:
                raise ValueError(f"layer {layer}: no forward pass to take the gradient of")
            self._d_out = model.backward(tape, self._d_out, input_grad=layer > 0)
        r.backend.synchronize()
        return r.hand(grads, unit=layer)
