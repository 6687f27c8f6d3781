"""Pipeline-parallel training: an Mlp cut into 3 stages on 3 (logical) CPU
devices, trained with the 1F1B schedule on 4 micro-batches per step, next to
the single-device Trainer on the same batches.

Run: python examples/pipeline_parallel.py
Prints the loss of both trainers every few steps, the largest weight
difference after training (float32 round-off, below 1e-4), the activations
each stage held at most (1F1B: 3 2 1) and an ASCII timeline of the last step.
"""

from __future__ import annotations

import argparse

import numpy as np

import atomr
from atomr import ActorSystem
from atomr.accel import cpu_devices
from atomr.train import GetWeights, LossKind, Mlp, OptimizerKind, Step, Trainer, TrainerConfig
from atomr.train.core import synthetic_classification
from atomr.train.pipeline import GetTimeline, PipelineOptions, PipelineParallelTrainer, Schedule


async def main() -> None:
    model = Mlp([16, 32, 32, 32, 4], activation="tanh", seed=0)
    x, y = synthetic_classification(30, 16, 4, seed=1)
    config = TrainerConfig(OptimizerKind.adam(0.01), LossKind.CROSS_ENTROPY, gradient_clip=1.0)
    options = PipelineOptions(micro_batch_size=8, schedule=Schedule.ONE_F_ONE_B)
    async with ActorSystem("pipeline-example") as system:
        pipe = await PipelineParallelTrainer.spawn(system, model, cpu_devices(3), config, options)
        single = await Trainer.spawn(system, model, "cpu:0", config)
        for step in range(1, 21):
            a = await pipe.ask(Step(x, y))
            b = await single.ask(Step(x, y))
            if step % 5 == 0:
                print(
                    f"step {step:2d}  pipeline loss {a.loss:.5f}  single-device loss {b.loss:.5f}"
                )
        diff = np.abs(await pipe.ask(GetWeights()) - await single.ask(GetWeights())).max()
        print(f"max weight difference: {diff:.2e}")
        timeline = await pipe.ask(GetTimeline())
        print("peak held activations per stage:", *timeline.peak_held)
        print(timeline.render(width=48))


if __name__ == "__main__":
    argparse.ArgumentParser(  # --help prints the docstring; it takes no options
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args()
    atomr.run(main())
