"""`fit` evaluates a dataset or a list of batches batch by batch, and the
figures equal one `Evaluate` of the whole set (what arrays get): with class
weights, each batch's loss counts by its normaliser (the sum of its targets'
weights), not by its sample count, which put the loss ~11% off."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from atomr import ActorSystem
from atomr.accel import cpu_devices
from atomr.train import (
    DataParallelOptions,
    DataParallelTrainer,
    Evaluate,
    GetWeights,
    LossKind,
    Mlp,
    OptimizerKind,
    Trainer,
    TrainerConfig,
)
from atomr.train.core import synthetic_classification
from atomr.train.fit import EpochRecord, Evaluator, fit
from tests.train.test_fit_sources import Batches

WEIGHTED = TrainerConfig(OptimizerKind.adam(0.01), LossKind.weighted_cross_entropy([0.1, 1, 5]))
X, Y = synthetic_classification(48, 6, 3, seed=1)
XV, YV = synthetic_classification(30, 6, 3, seed=2)
BY_CLASS = np.argsort(YV, kind="stable")  # a set stored by class: its batches' mixes differ
XS, YS = XV[BY_CLASS], YV[BY_CLASS]

STRATEGIES: dict[str, tuple[Any, Any, int]] = {
    "single": (Trainer, None, 1),
    "data": (DataParallelTrainer, DataParallelOptions(), 2),
}


async def _validated(
    system: ActorSystem,
    strategy: str,
    validation: Any,
    config: TrainerConfig = WEIGHTED,
    hook: Any = None,
) -> EpochRecord:
    """One epoch on `(X, Y)` (the same weights every time), validated on `validation`."""
    trainer_class, options, n = STRATEGIES[strategy]
    model = Mlp([6, 8, 3], seed=0)
    ref = await trainer_class.spawn(system, model, cpu_devices(n), config, options)
    evaluate = hook(ref) if hook is not None else None
    result = await fit(ref, (X, Y), validation=validation, epochs=1, batch_size=16,
                       evaluate=evaluate)  # fmt: skip
    await ref.stop()
    return result.epochs[0]


@pytest.mark.parametrize("strategy", list(STRATEGIES))
async def test_class_weighted_loss_batch_by_batch_equals_the_whole_set(strategy: str) -> None:
    async with ActorSystem("fit-evaluation") as system:
        whole = await _validated(system, strategy, (XS, YS))
        batches = [(XS[i : i + 16], YS[i : i + 16]) for i in range(0, 30, 16)]
        for validation in (Batches(XS, YS), batches):
            record = await _validated(system, strategy, validation)
            assert record.test_loss == pytest.approx(whole.test_loss, rel=1e-6)
            assert record.test_accuracy == pytest.approx(whole.test_accuracy, rel=1e-6)


YZ = np.where(np.arange(30) < 16, 0, np.maximum(YS, 1))  # batch 0: class 0 alone
ZERO_FIRST = TrainerConfig(OptimizerKind.adam(0.01), LossKind.weighted_cross_entropy([0, 1, 5]))


@pytest.mark.parametrize("strategy", list(STRATEGIES))
async def test_a_batch_whose_targets_all_weigh_0_counts_nothing_in_the_sets_loss(
    strategy: str,
) -> None:
    """Its loss is undefined (NaN, weighted by its normaliser, 0), its
    accuracy counts: the set was refused, before any step, when such a
    batch came first (the validation set's probe)."""
    async with ActorSystem("fit-evaluation") as system:
        whole = await _validated(system, strategy, (XS, YZ), ZERO_FIRST)
        batches = [(XS[i : i + 16], YZ[i : i + 16]) for i in range(0, 30, 16)]
        for validation in (Batches(XS, YZ), batches):
            record = await _validated(system, strategy, validation, ZERO_FIRST)
            assert record.test_loss == pytest.approx(whole.test_loss, rel=1e-6)
            assert record.test_accuracy == pytest.approx(whole.test_accuracy, rel=1e-6)
    assert np.isfinite(whole.test_loss)


def _asking(ref: Any) -> Evaluator:
    async def evaluate(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        result = await ref.ask(Evaluate(x, y))
        return result.loss, result.accuracy

    return evaluate


async def test_a_hooks_mean_over_labels_batch_by_batch_equals_the_whole_set() -> None:
    """A hook gives no normaliser: its figures are weighted by label count,
    exact for a loss that is a mean over labels."""
    plain = TrainerConfig(OptimizerKind.adam(0.01), LossKind.CROSS_ENTROPY)
    async with ActorSystem("fit-evaluation") as system:
        whole = await _validated(system, "single", (XS, YS), plain, _asking)
        record = await _validated(system, "single", Batches(XS, YS), plain, _asking)
    assert record.test_loss == pytest.approx(whole.test_loss, rel=1e-6)
    assert record.test_accuracy == pytest.approx(whole.test_accuracy, rel=1e-6)


async def _no_figures(x: np.ndarray, y: np.ndarray) -> None:
    return None


async def _one_figure(x: np.ndarray, y: np.ndarray) -> tuple[float]:
    return (0.5,)


async def _words(x: np.ndarray, y: np.ndarray) -> tuple[str, str]:
    return ("low", "high")


@pytest.mark.parametrize(
    ("hook", "needle"),
    [
        (lambda x, y: (0.5, 0.5), "evaluate must be an async function .* returned tuple"),
        (_no_figures, r"evaluate must return \(loss, accuracy\), got None"),
        (_one_figure, r"evaluate must return \(loss, accuracy\), got \(0.5,\)"),
        (_words, r"evaluate must return two numbers \(loss, accuracy\), got \('low', 'high'\)"),
    ],
)
@pytest.mark.parametrize("validation", [(XV, YV), None], ids=["validation", "none"])
async def test_a_misused_evaluate_hook_is_refused_naming_it_before_any_step(
    hook: Any, needle: str, validation: Any
) -> None:
    """Without a validation set too: the hook was first called after the
    first epoch's training, which was wasted."""
    async with ActorSystem("fit-evaluation") as system:
        ref = await Trainer.spawn(system, Mlp([6, 8, 3], seed=0), "cpu:0", WEIGHTED)
        before = await ref.ask(GetWeights())
        with pytest.raises(TypeError, match=needle):
            await fit(ref, (X, Y), validation=validation, epochs=1, batch_size=16, evaluate=hook)
        np.testing.assert_array_equal(await ref.ask(GetWeights()), before)


@pytest.mark.parametrize("accumulation", [1, 2, 3])
async def test_the_epochs_train_loss_is_the_mean_over_its_samples(accumulation: int) -> None:
    # lr 0: the weights stay, so the epoch's mean loss is the set's. An
    # applying step's loss is its window's mean: counted once, not again
    # on top of its micro-steps' own (5 batches: the last window stays open)
    x, y = synthetic_classification(40, 6, 3, seed=1)
    config = TrainerConfig(
        OptimizerKind.sgd(0.0), LossKind.CROSS_ENTROPY, accumulation_steps=accumulation
    )
    async with ActorSystem("fit-loss") as system:
        trainer = await Trainer.spawn(system, Mlp([6, 8, 3], seed=0), "cpu:0", config)
        whole = await trainer.ask(Evaluate(x, y))
        result = await fit(trainer, (x, y), epochs=1, batch_size=8)
    assert result.epochs[0].train_loss == pytest.approx(whole.loss, rel=1e-6)
