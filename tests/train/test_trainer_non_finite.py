"""A non-finite update or loss is refused, named, and changes nothing (issue 17)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from atomr import ActorSystem
from atomr.accel import cpu_devices
from atomr.train import (
    Evaluate,
    GetWeights,
    LossKind,
    Mlp,
    NonFiniteError,
    OptimizerKind,
    Step,
    TrainerConfig,
)
from atomr.train.core import synthetic_classification
from tests.train.test_contract import STRATEGIES

SIZES = [6, 16, 16, 3]


def _config(optimizer: OptimizerKind) -> TrainerConfig:
    return TrainerConfig(optimizer=optimizer, loss=LossKind.CROSS_ENTROPY)


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize(
    "optimizer",
    [OptimizerKind.sgd(1e36), OptimizerKind.sgd(1e36, momentum=0.9, weight_decay=0.1)],
    ids=["sgd", "sgd_momentum"],
)
async def test_an_overflowing_update_is_refused_and_changes_nothing(optimizer, strategy) -> None:
    trainer_class, options, n = STRATEGIES[strategy]
    x, y = synthetic_classification(32, SIZES[0], SIZES[-1], seed=0)
    x = x * 1e4  # finite loss; first-layer gradients of ~1e3, so lr * g overflows float32
    async with ActorSystem() as system:
        model = Mlp(SIZES, seed=1)
        ref = await trainer_class.spawn(system, model, cpu_devices(n), _config(optimizer), options)
        before = await ref.ask(GetWeights(), timeout=10)
        for _ in range(2):  # the actor was not restarted; the update stays refused
            with pytest.raises(NonFiniteError, match="update 1 .*non-finite; not applied"):
                await ref.ask(Step(x, y), timeout=10)
            np.testing.assert_array_equal(await ref.ask(GetWeights(), timeout=10), before)
        stats = await ref.ask(Step(x / 1e4, y), timeout=10)  # a sane batch still trains
        assert stats.applied and np.isfinite(await ref.ask(GetWeights(), timeout=10)).all()


@pytest.mark.parametrize("strategy", list(STRATEGIES))
async def test_evaluate_never_answers_a_non_finite_loss(strategy) -> None:
    trainer_class, options, n = STRATEGIES[strategy]
    x, y = synthetic_classification(32, SIZES[0], SIZES[-1], seed=0)
    huge = np.full_like(x, 3e38)  # finite input; the logits overflow
    async with ActorSystem() as system:
        config = _config(OptimizerKind.sgd(0.1))
        ref = await trainer_class.spawn(system, Mlp(SIZES, seed=1), cpu_devices(n), config, options)
        with pytest.raises(NonFiniteError, match="evaluation loss is not finite"):
            await ref.ask(Evaluate(huge, y), timeout=10)
        result = await ref.ask(Evaluate(x, y), timeout=10)  # not restarted, still answers
        assert np.isfinite(result.loss)


@pytest.mark.parametrize("strategy", list(STRATEGIES))
async def test_evaluate_answers_a_nan_loss_for_targets_that_all_weigh_0(strategy) -> None:
    """torch's 0/0, with a normaliser of 0 that `fit` weights it by (a Step
    of them is refused: its gradient is undefined)."""
    trainer_class, options, n = STRATEGIES[strategy]
    x, _ = synthetic_classification(32, SIZES[0], SIZES[-1], seed=0)
    zeros = np.zeros(32, dtype=np.int64)
    config = TrainerConfig(OptimizerKind.sgd(0.1), LossKind.weighted_cross_entropy([0, 1, 1]))
    async with ActorSystem() as system:
        ref = await trainer_class.spawn(system, Mlp(SIZES, seed=1), cpu_devices(n), config, options)
        result = await ref.ask(Evaluate(x, zeros), timeout=10)
        assert np.isnan(result.loss) and result.normaliser == 0.0
        assert 0.0 <= result.accuracy <= 1.0 and result.samples == 32
        with pytest.raises(ValueError):  # an InvalidBatchError (ps: "the round was empty")
            await ref.ask(Step(x, zeros), timeout=10)


@pytest.mark.parametrize("strategy", list(STRATEGIES))
async def test_an_overflowing_gradient_is_refused_without_a_numpy_warning(strategy) -> None:
    """float64 features of 1e300: the gradient overflows, and every trainer
    refuses the step with `NonFiniteError` from its own explicit check, with
    no NumPy `RuntimeWarning` on the way (ZeRO's squared norm of its pieces
    let NumPy's overflow warning out to the user)."""
    trainer_class, options, n = STRATEGIES[strategy]
    x, y = synthetic_classification(8, SIZES[0], SIZES[-1], seed=0)
    async with ActorSystem() as system:
        model = Mlp(SIZES, seed=1, dtype=np.float64)
        config = _config(OptimizerKind.sgd(0.1))
        ref = await trainer_class.spawn(system, model, cpu_devices(n), config, options)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(NonFiniteError):
                await ref.ask(Step(x.astype(np.float64) * 1e300, y), timeout=10)
        np.testing.assert_array_equal(await ref.ask(GetWeights(), timeout=10), model.get_params())
    assert [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)] == []
