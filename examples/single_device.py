"""The single-device Trainer on scikit-learn's digits: spawn it, train a few
epochs with `fit` (the library's one epoch loop: it shuffles, sends one
`Step` per batch, evaluates the validation set after every epoch and saves
the checkpoint), print each epoch from a `FitCallback`, then load the
checkpoint into a fresh trainer that answers exactly as the first one.

Run: python examples/single_device.py   (needs the [train] extra for digits)

Prints:
    train <n> samples, test <m> samples, model 64-64-10 (<p> parameters)
    epoch <e> loss <..> test accuracy <..>       (one line per epoch, 5 epochs)
    steps <s>
    checkpoint reloaded: same weights True, same test accuracy True
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

import atomr
from atomr import ActorSystem
from atomr.train import (
    Evaluate,
    FitCallback,
    GetWeights,
    LoadCheckpoint,
    LossKind,
    Mlp,
    OptimizerKind,
    Trainer,
    TrainerConfig,
    fit,
)
from atomr.train.core import load_digits_split
from atomr.train.fit import EpochRecord

EPOCHS = 5
BATCH = 32


class PrintEpochs(FitCallback):
    """Progress: one line per finished epoch (`fit` evaluated it already)."""

    def on_epoch_end(self, record: EpochRecord, epochs: int) -> None:
        print(
            f"epoch {record.epoch} loss {record.train_loss:.4f} "
            f"test accuracy {record.test_accuracy:.4f}"
        )


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
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "digits.ckpt"
            result = await fit(
                trainer,
                (x_train, y_train),
                epochs=EPOCHS,
                batch_size=BATCH,
                seed=0,
                validation=(x_test, y_test),
                checkpoint=path,  # saved after every epoch and at the end
                callbacks=[PrintEpochs()],
            )
            # result.epochs is the run's history: one EpochRecord per epoch
            print(f"steps {result.position.step}")
            fresh = await Trainer.spawn(system, Mlp([64, 64, 10], seed=1), "cpu:0", config)
            await fresh.ask(LoadCheckpoint(path))
        same_weights = np.array_equal(
            await trainer.ask(GetWeights()), await fresh.ask(GetWeights())
        )
        reloaded = await fresh.ask(Evaluate(x_test, y_test))
        same_accuracy = reloaded.accuracy == result.epochs[-1].test_accuracy
        print(
            f"checkpoint reloaded: same weights {same_weights}, same test accuracy {same_accuracy}"
        )


if __name__ == "__main__":
    argparse.ArgumentParser(  # --help prints the docstring; it takes no options
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args()
    atomr.run(main())
