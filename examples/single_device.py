"""The single-device Trainer on scikit-learn's digits: spawn it, train a few
epochs with Step messages, evaluate, save a checkpoint and load it into a
fresh trainer that then answers exactly as the first one.

Run: python examples/single_device.py   (needs the [train] extra for digits)

Prints:
    train <n> samples, test <m> samples, model 64-64-10 (<p> parameters)
    epoch <e> loss <..> test accuracy <..>       (one line per epoch, 5 epochs)
    steps <s>
    checkpoint reloaded: same weights True, same test accuracy True
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

import atomr
from atomr import ActorSystem
from atomr.train import (
    Evaluate,
    GetWeights,
    LoadCheckpoint,
    LossKind,
    Mlp,
    OptimizerKind,
    SaveCheckpoint,
    Step,
    Trainer,
    TrainerConfig,
    load_digits_split,
)

EPOCHS = 5
BATCH = 32


async def main() -> None:
    x_train, y_train, x_test, y_test = load_digits_split(seed=0)
    model = Mlp([64, 64, 10], activation="relu", seed=0)
    config = TrainerConfig(OptimizerKind.adam(0.005), LossKind.CROSS_ENTROPY)
    print(
        f"train {len(y_train)} samples, test {len(y_test)} samples, "
        f"model 64-64-10 ({model.n_params} parameters)"
    )
    async with ActorSystem("single-device") as system:
        trainer = await Trainer.spawn(system, model, ["cpu:0"], config, name="trainer")
        steps = 0
        for epoch in range(1, EPOCHS + 1):
            order = np.random.default_rng(epoch).permutation(len(y_train))
            losses = []
            for start in range(0, len(order), BATCH):
                idx = order[start : start + BATCH]
                stats = await trainer.ask(Step(x_train[idx], y_train[idx]))
                losses.append(stats.loss)
                steps += 1
            result = await trainer.ask(Evaluate(x_test, y_test))
            print(f"epoch {epoch} loss {np.mean(losses):.4f} test accuracy {result.accuracy:.4f}")
        print(f"steps {steps}")

        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "digits.ckpt"
            await trainer.ask(SaveCheckpoint(path))
            fresh = await Trainer.spawn(system, Mlp([64, 64, 10], seed=1), "cpu:0", config)
            await fresh.ask(LoadCheckpoint(path))
        same_weights = np.array_equal(
            await trainer.ask(GetWeights()), await fresh.ask(GetWeights())
        )
        same_accuracy = (await fresh.ask(Evaluate(x_test, y_test))).accuracy == result.accuracy
        print(
            f"checkpoint reloaded: same weights {same_weights}, same test accuracy {same_accuracy}"
        )


if __name__ == "__main__":
    atomr.run(main())
