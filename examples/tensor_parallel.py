"""Tensor parallelism: one MLP split over three shard actors, trained side by
side with the single-device Trainer; the two end with the same weights.

Prints:
    shards=3 params per shard: [..] total=<model parameters>
    step <i> loss tp=<..> single=<..>        (every 5th of 20 steps)
    max |tp - single| weight difference: <small>
    same weights: True
"""

from __future__ import annotations

import argparse

import numpy as np

import atomr
from atomr import ActorSystem
from atomr.train import (
    GetWeights,
    LossKind,
    Mlp,
    OptimizerKind,
    Step,
    TensorParallelTrainer,
    Trainer,
    TrainerConfig,
)
from atomr.train.core import synthetic_classification
from atomr.train.tensor_parallel.sharding import shard_layout


async def main() -> None:
    model = Mlp([20, 50, 31, 7], activation="relu", seed=0)  # widths not divisible by 3
    config = TrainerConfig(OptimizerKind.adamw(0.01), LossKind.CROSS_ENTROPY)
    async with ActorSystem("tp-example") as system:
        devices = ["cpu:0", "cpu:1", "cpu:2"]  # one shard per device
        tp = await TensorParallelTrainer.spawn(system, model, devices, config, name="tp")
        single = await Trainer.spawn(system, model, "cpu:0", config)
        sizes = [shard_layout(model.sizes, 3, rank).n_params for rank in range(3)]
        print(f"shards={len(sizes)} params per shard: {sizes} total={model.n_params}")
        for i in range(20):
            x, y = synthetic_classification(64, 20, 7, seed=i)
            a = await tp.ask(Step(x, y))
            b = await single.ask(Step(x, y))
            if i % 5 == 4:
                print(f"step {i + 1} loss tp={a.loss:.6f} single={b.loss:.6f}")
        diff = float(np.max(np.abs(await tp.ask(GetWeights()) - await single.ask(GetWeights()))))
        print(f"max |tp - single| weight difference: {diff:.2e}")
        print(f"same weights: {diff < 1e-4}")


if __name__ == "__main__":
    argparse.ArgumentParser(  # --help prints the docstring; it takes no options
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args()
    atomr.run(main())
