"""Bring your own layer: a learnable per-feature `Scale`, gradient-checked,
in a model trained by data parallel and by one device, which agree.

A layer declares its parameters and computes on views of the model's flat
vector (`atomr.train.core.model.Layer`). `Scale` computes with NumPy, so it
runs on CPU devices; a layer for GPUs calls the backend's kernels instead.
Run it with `python examples/custom_layer.py`.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

import atomr
from atomr import ActorSystem
from atomr.accel import cpu_devices
from atomr.train import (
    DataParallelTrainer,
    GetWeights,
    LossKind,
    OptimizerKind,
    Step,
    Trainer,
    TrainerConfig,
)
from atomr.train.core import synthetic_classification
from atomr.train.core.model import (
    Activation,
    ForwardContext,
    Layer,
    Linear,
    Sequential,
    gradient_check,
    register_layer,
)


@register_layer
class Scale(Layer):
    """`y = x * s`, one learnable factor per feature (initialised to 1)."""

    kind = "scale"

    def __init__(self, width: int) -> None:
        self.width = width

    def param_shapes(self) -> list[tuple[int, ...]]:
        return [(self.width,)]

    def init_params(self, rng: np.random.Generator) -> list[np.ndarray]:
        return [np.ones(self.width)]

    def out_shape(self, in_shape: tuple[int, ...]) -> tuple[int, ...]:
        if in_shape[-1] != self.width:
            raise ValueError(f"Scale({self.width}) cannot take {in_shape}")
        return in_shape

    def forward(self, be: Any, params: list[Any], x: Any, ctx: ForwardContext) -> tuple[Any, Any]:
        return x * params[0], x  # keep x for the backward pass

    def backward(self, be, params, grads, saved, dy, accumulate, input_grad):  # noqa: ANN001, ANN201
        ds = np.sum(dy * saved, axis=0)
        if accumulate:
            grads[0] += ds
        else:
            grads[0][...] = ds
        return dy * params[0] if input_grad else None

    def config(self) -> dict[str, Any]:
        return {"kind": self.kind, "width": self.width}


async def main() -> None:
    """Check the layer, then train it both ways and compare."""
    error = gradient_check(Scale(5), (5,))
    print(f"Scale: largest error against finite differences {error:.1e}")

    def model() -> Sequential:
        layers = [Linear(12, 16), Scale(16), Activation("tanh"), Linear(16, 3)]
        return Sequential(layers, (12,), seed=0)

    config = TrainerConfig(OptimizerKind.adam(0.01), LossKind.CROSS_ENTROPY)
    xs, ys = synthetic_classification(48 * 20, 12, 3, seed=1)
    async with ActorSystem("custom-layer") as system:
        single = await Trainer.spawn(system, model(), ["cpu:0"], config)
        parallel = await DataParallelTrainer.spawn(system, model(), cpu_devices(2), config)
        for step in range(20):
            x, y = xs[48 * step : 48 * (step + 1)], ys[48 * step : 48 * (step + 1)]
            a, b = await single.ask(Step(x, y)), await parallel.ask(Step(x, y))
            if step % 5 == 0 or step == 19:
                print(f"step {step:2d}  loss single {a.loss:.6f}  data-parallel {b.loss:.6f}")
        diff = np.max(np.abs(await single.ask(GetWeights()) - await parallel.ask(GetWeights())))
        print(f"max |data-parallel - single| weight difference: {diff:.2e}")
        print("MATCH" if error < 1e-6 and diff < 1e-4 else "MISMATCH")


if __name__ == "__main__":
    argparse.ArgumentParser(  # --help prints the docstring; it takes no options
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args()
    atomr.run(main())
