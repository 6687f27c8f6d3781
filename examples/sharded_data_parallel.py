"""Sharded data parallel (ZeRO) on 3 CPU replicas, checked against one device.

A `ShardedDataParallelTrainer` at the chosen stage and a single-device
`Trainer` take the same 30 AdamW steps (clipped) on the same batches. The
script prints the loss now and then, what each replica holds (weights,
gradients, optimizer state: the sharded parts at about a third of one
device's), and the largest weight difference from one device. Run it with
`python examples/sharded_data_parallel.py [--stage 1|2|3]`.
"""

from __future__ import annotations

import argparse

import numpy as np

import atomr
from atomr import ActorSystem
from atomr.accel import cpu_devices
from atomr.train import (
    GetWeights,
    LossKind,
    Mlp,
    OptimizerKind,
    ShardedDataParallelTrainer,
    ShardedOptions,
    Step,
    Trainer,
    TrainerConfig,
)
from atomr.train.core import synthetic_classification
from atomr.train.sharded import GetShardMemory


async def main(stage: int) -> None:
    """Train both trainers side by side; print memory and how far apart they are."""
    model = Mlp([20, 31, 32, 4], seed=0)  # 1,807 parameters: 3 replicas split them unevenly
    config = TrainerConfig(OptimizerKind.adamw(0.01), LossKind.CROSS_ENTROPY, gradient_clip=1.0)
    async with ActorSystem("example") as system:
        single = await Trainer.spawn(system, model, ["cpu:0"], config)
        sharded = await ShardedDataParallelTrainer.spawn(
            system, model, cpu_devices(3), config, ShardedOptions(stage=stage)
        )
        xs, ys = synthetic_classification(64 * 30, 20, 4, seed=0)
        for step in range(30):
            x, y = xs[64 * step : 64 * (step + 1)], ys[64 * step : 64 * (step + 1)]
            a = await single.ask(Step(x, y))
            b = await sharded.ask(Step(x, y))
            if step % 10 == 0 or step == 29:
                print(f"step {step:2d}  loss single {a.loss:.6f}  sharded {b.loss:.6f}")
        full = model.n_params * 4
        print(f"stage {stage}: one device holds {full} bytes of weights, of gradients, "
              f"and {2 * full} of Adam state")  # fmt: skip
        for k, m in enumerate(await sharded.ask(GetShardMemory())):
            print(f"replica {k}: weights {m.weights}  gradients {m.gradients}  "
                  f"optimizer {m.optimizer}")  # fmt: skip
        diff = float(
            np.max(np.abs(await sharded.ask(GetWeights()) - await single.ask(GetWeights())))
        )
        print(f"max |sharded - single| weight difference: {diff:.2e}")
        print("MATCH" if diff < 1e-4 else "MISMATCH")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--stage",
        type=int,
        choices=(1, 2, 3),
        default=3,
        help="ZeRO stage: shard the optimizer state (1), and the gradients (2), "
        "and the weights (3) (default: 3)",
    )
    atomr.run(main(parser.parse_args().stage))
