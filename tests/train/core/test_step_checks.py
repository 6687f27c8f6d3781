"""`core.step_checks`: the one home of the loss, normaliser and gradient checks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from atomr.train.core._step_checks import check_gradient, check_loss, check_normaliser
from atomr.train.core.errors import InvalidBatchError, NonFiniteError
from atomr.train.core.loss import LossKind


@pytest.mark.parametrize("value", [0.0, -3.5, 1e300])
def test_finite_values_pass(value: float) -> None:
    check_loss(value)
    check_gradient(abs(value))


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_non_finite_loss_and_gradient_are_refused(value: float) -> None:
    with pytest.raises(NonFiniteError, match=r"loss is not finite \((nan|-?inf)\); step not"):
        check_loss(value)
    with pytest.raises(NonFiniteError, match="gradient is not finite; step not applied"):
        check_gradient(value)
    with pytest.raises(NonFiniteError, match="micro-step not applied"):
        check_gradient(value, "micro-step")


@pytest.mark.parametrize("normaliser", [0.0, -1.0])
def test_a_zero_normaliser_is_an_undefined_loss(normaliser: float) -> None:
    with pytest.raises(InvalidBatchError, match="class weight 0; the loss is undefined"):
        check_normaliser(normaliser)
    check_normaliser(1e-30)


def test_loss_compute_uses_the_same_check() -> None:
    """`LossKind.compute` refuses targets whose class weights are all 0 with
    the trainers' error (an InvalidBatchError, still a ValueError)."""
    kind = LossKind.weighted_cross_entropy([0.0, 1.0])
    with pytest.raises(InvalidBatchError, match="class weight 0"):
        kind.compute(np.zeros((2, 2), dtype=np.float32), np.array([0, 0]))
    value, _ = kind.compute(np.zeros((2, 2), dtype=np.float32), np.array([0, 1]))
    assert value == pytest.approx(math.log(2.0))
