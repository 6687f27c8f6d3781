"""A small GPT on the Python documentation, trained by any strategy, checked
against one device, then asked for a sample.

    python examples/gpt.py --strategy data|zero|tensor|pipeline|ps|single

The chosen trainer and a single-device `Trainer` take the same 30 steps on
the same windows of `pydoc_data.topics` (dropout on); the script prints the
losses now and then, the largest weight difference, and 80 generated
characters.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

import atomr
from atomr import ActorSystem
from atomr.accel import cpu_devices
from atomr.train import (
    AsyncParameterServer,
    DataParallelTrainer,
    GetWeights,
    LossKind,
    OptimizerKind,
    ParameterServerOptions,
    PipelineOptions,
    PipelineParallelTrainer,
    ShardedDataParallelTrainer,
    ShardedOptions,
    Step,
    TensorParallelTrainer,
    Trainer,
    TrainerConfig,
)
from atomr.train.core.model import gpt
from atomr.train.core.text import char_lm_split, generate, pydoc_text
from atomr.train.parameter_server import Consistency

STRATEGIES: dict[str, tuple[Any, Any, int]] = {
    "single": (Trainer, None, 1),
    "data": (DataParallelTrainer, None, 2),
    "zero": (ShardedDataParallelTrainer, ShardedOptions(stage=2), 2),
    "tensor": (TensorParallelTrainer, None, 2),
    "pipeline": (PipelineParallelTrainer, PipelineOptions(micro_batch_size=4), 2),
    "ps": (
        AsyncParameterServer,
        ParameterServerOptions(workers=1, consistency=Consistency.synchronous()),
        1,
    ),
}


async def main(strategy: str) -> None:
    """Train side by side with one device; print the difference and a sample."""
    x_tr, y_tr, _, _, vocab = char_lm_split(pydoc_text(), 32)
    config = TrainerConfig(
        OptimizerKind.sgd(0.5, momentum=0.9), LossKind.CROSS_ENTROPY, gradient_clip=1.0
    )

    def model() -> Any:
        return gpt(len(vocab), 32, n_layer=1, n_head=2, d_model=32, dropout=0.1, seed=0)

    cls, options, n = STRATEGIES[strategy]
    async with ActorSystem("gpt-example") as system:
        single = await Trainer.spawn(system, model(), ["cpu:0"], config)
        other = await cls.spawn(
            system, model(), cpu_devices(n) if n > 1 else ["cpu:0"], config, options
        )
        for step in range(30):
            x, y = x_tr[16 * step : 16 * (step + 1)], y_tr[16 * step : 16 * (step + 1)]
            a, b = await single.ask(Step(x, y)), await other.ask(Step(x, y))
            if step % 10 == 0 or step == 29:
                print(f"step {step:2d}  loss single {a.loss:.6f}  {strategy} {b.loss:.6f}")
        weights = await other.ask(GetWeights())
        diff = float(np.max(np.abs(weights - await single.ask(GetWeights()))))
        trained = model()
        trained.set_params(weights)
        print(f"max |{strategy} - single| weight difference: {diff:.2e}")
        print("sample:", repr(generate(trained, vocab, "The ", 80, seed=1)))
        print("MATCH" if diff < 1e-4 else "MISMATCH")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--strategy",
        choices=list(STRATEGIES),
        default="data",
        help="the trainer set beside one device (default: data)",
    )
    atomr.run(main(parser.parse_args().strategy))
