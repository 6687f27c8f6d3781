"""A hand-written data-parallel loop, as with flodl's manual `Ddp` verbs.

Some loops do not fit `Step` (GANs, RL, progressive training): they run
each part of a step themselves. Here two replicas each take a batch of
their own size (a fast device takes more), the gradients are all-reduced
weighted by those batch counts, and every replica applies the result; the
same happens on one device with the union of the batches. The script prints
the loss now and then, the world size and devices, and at the end the
largest weight difference. Run it with `python examples/manual_data_parallel.py`.
"""

from __future__ import annotations

import argparse

import numpy as np

import atomr
from atomr import ActorSystem
from atomr.accel import cpu_devices
from atomr.train import GetWeights, LossKind, Mlp, OptimizerKind, Step, Trainer, TrainerConfig
from atomr.train.core import synthetic_classification
from atomr.train.data_parallel import (
    ApplyGradients,
    ComputeReplicaGradients,
    DataParallelTrainer,
    GetDevices,
    GetReplicaWeights,
    GetWorldSize,
    SyncParams,
    WeightedAllReduceGradients,
)


async def main() -> None:
    x, y = synthetic_classification(1200, 10, 4, seed=0)
    config = TrainerConfig(OptimizerKind.adam(0.01), LossKind.CROSS_ENTROPY)
    async with ActorSystem("manual") as system:
        ddp = await DataParallelTrainer.spawn(system, Mlp([10, 32, 4]), cpu_devices(2), config)
        reference = await Trainer.spawn(system, Mlp([10, 32, 4]), "cpu:0", config)
        world, devices = await ddp.ask(GetWorldSize()), await ddp.ask(GetDevices())
        print(f"world size {world}: {', '.join(map(str, devices))}")
        await ddp.ask(SyncParams())  # every replica starts from replica 0's weights
        start = 0
        for step in range(30):
            fast, slow = 24, 8  # replica 0 is taken to be 3x faster
            mid, end = start + fast, start + fast + slow
            losses = await ddp.ask(
                ComputeReplicaGradients([(x[start:mid], y[start:mid]), (x[mid:end], y[mid:end])])
            )
            await ddp.ask(WeightedAllReduceGradients([fast, slow]))
            await ddp.ask(ApplyGradients())
            stats = await reference.ask(Step(x[start:end], y[start:end]))
            if step % 10 == 0 or step == 29:
                mean = (losses[0] * fast + losses[1] * slow) / (fast + slow)
                print(f"step {step:2d}: loss {mean:.4f} (one device: {stats.loss:.4f})")
            start = end % (len(y) - 32)
        replicas = await ddp.ask(GetReplicaWeights())
        diff = float(np.abs(replicas[0] - await reference.ask(GetWeights())).max())
        print(f"replicas identical: {bool(np.array_equal(replicas[0], replicas[1]))}")
        print(f"largest weight difference from one device: {diff:.2e}")
        print("MATCH" if diff < 1e-4 else "MISMATCH")


if __name__ == "__main__":
    argparse.ArgumentParser(  # --help prints the docstring; it takes no options
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args()
    atomr.run(main())
