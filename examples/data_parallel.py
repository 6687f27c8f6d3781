"""Data-parallel training on 3 CPU replicas, checked against one device.

A `DataParallelTrainer` with 3 replicas (uneven shards: 64 rows split
22 + 21 + 21) and a single-device `Trainer` take the same 30 AdamW steps on
the same batches; the script prints the loss now and then, and at the end
the largest weight difference between the two and whether the replicas are
identical. Run it with `python examples/data_parallel.py [--collective ring]`.
"""

from __future__ import annotations

import argparse

import numpy as np

import atomr
from atomr import ActorSystem
from atomr.accel import cpu_devices
from atomr.train import (
    DataParallelOptions,
    DataParallelTrainer,
    GetWeights,
    LossKind,
    Mlp,
    OptimizerKind,
    Step,
    Trainer,
    TrainerConfig,
)
from atomr.train.core import synthetic_classification
from atomr.train.data_parallel import GetReplicaWeights


async def main(collective: str) -> None:
    """Train both trainers side by side and print how far apart they are."""
    model = Mlp([20, 32, 32, 4], seed=0)
    config = TrainerConfig(OptimizerKind.adamw(0.01), LossKind.CROSS_ENTROPY)
    async with ActorSystem("example") as system:
        # the same contract: (system, model, devices, config, options)
        single = await Trainer.spawn(system, model, ["cpu:0"], config)
        parallel = await DataParallelTrainer.spawn(
            system, model, cpu_devices(3), config, DataParallelOptions(collective)
        )
        xs, ys = synthetic_classification(64 * 30, 20, 4, seed=0)
        for step in range(30):
            x, y = xs[64 * step : 64 * (step + 1)], ys[64 * step : 64 * (step + 1)]
            a = await single.ask(Step(x, y))
            b = await parallel.ask(Step(x, y))
            if step % 10 == 0 or step == 29:
                print(f"step {step:2d}  loss single {a.loss:.6f}  data-parallel {b.loss:.6f}")
        w_single = await single.ask(GetWeights())
        replicas = await parallel.ask(GetReplicaWeights())
        diff = float(np.max(np.abs(replicas[0] - w_single)))
        identical = all(np.array_equal(w, replicas[0]) for w in replicas)
        print(f"collective: {collective}")
        print(f"replicas identical: {identical}")
        print(f"max |data-parallel - single| weight difference: {diff:.2e}")
        print("MATCH" if identical and diff < 1e-4 else "MISMATCH")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--collective",
        choices=["host", "ring"],
        default="host",
        help="how the replicas all-reduce: on the host, or in a ring of actors (default: host)",
    )
    atomr.run(main(parser.parse_args().collective))
