"""LossKind against hand-derived values and torch.nn.functional formulas (NumPy)."""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from atomr.train import InvalidBatchError, LossKind
from tests.train.train_reference import ref_cross_entropy, ref_mse


def test_mse_hand_derived() -> None:
    y = np.array([[1.0, 2.0], [3.0, 5.0]], dtype=np.float32)
    t = np.array([[0.0, 2.0], [3.0, 3.0]], dtype=np.float32)
    value, grad = LossKind.MSE.compute(y, t)
    # differences 1, 0, 0, 2 -> (1 + 4) / 4 elements
    assert value == pytest.approx(1.25)
    np.testing.assert_allclose(grad, [[0.5, 0.0], [0.0, 1.0]], rtol=1e-6)
    assert grad.dtype == np.float32


def test_cross_entropy_hand_derived() -> None:
    z = np.array([[0.0, 0.0], [math.log(3.0), 0.0]], dtype=np.float64)
    labels = np.array([0, 1])
    value, grad = LossKind.CROSS_ENTROPY.compute(z, labels)
    # sample 0: p = (1/2, 1/2) -> -log(1/2); sample 1: p = (3/4, 1/4) -> -log(1/4)
    assert value == pytest.approx((math.log(2) + math.log(4)) / 2, rel=1e-12)
    np.testing.assert_allclose(grad, [[-0.25, 0.25], [0.375, -0.375]], rtol=1e-12)


def test_weighted_cross_entropy_hand_derived() -> None:
    z = np.zeros((3, 2))
    labels = np.array([0, 1, 1])
    value, grad = LossKind.weighted_cross_entropy([1.0, 3.0]).compute(z, labels)
    # every sample has -log(1/2); weights 1, 3, 3 -> (1+3+3) log2 / 7
    assert value == pytest.approx(math.log(2), rel=1e-12)
    np.testing.assert_allclose(grad[0], [-0.5 / 7, 0.5 / 7], rtol=1e-12)
    np.testing.assert_allclose(grad[1], [1.5 / 7, -1.5 / 7], rtol=1e-12)


@pytest.mark.parametrize("dtype,rtol", [(np.float32, 2e-5), (np.float64, 1e-10)])
def test_losses_match_torch_formulas(dtype, rtol) -> None:
    rng = np.random.default_rng(3)
    z = (rng.standard_normal((37, 7)) * 4).astype(dtype)
    labels = rng.integers(0, 7, size=37)
    t = rng.standard_normal((37, 7)).astype(dtype)
    w = rng.uniform(0.1, 2.0, size=7)
    for kind, ref in (
        (LossKind.MSE, ref_mse(z, t)),
        (LossKind.CROSS_ENTROPY, ref_cross_entropy(z, labels)),
        (LossKind.weighted_cross_entropy(w), ref_cross_entropy(z, labels, w)),
    ):
        target = t if kind is LossKind.MSE else labels
        value, grad = kind.compute(z, target)
        assert value == pytest.approx(ref[0], rel=rtol)
        np.testing.assert_allclose(grad, ref[1], rtol=rtol, atol=rtol * 1e-2)


def test_cross_entropy_stable_for_large_logits() -> None:
    z = np.array([[1000.0, 0.0], [0.0, -1000.0]], dtype=np.float32)
    value, grad = LossKind.CROSS_ENTROPY.compute(z, np.array([1, 0]))
    assert value == pytest.approx(500.0, rel=1e-6)
    assert np.isfinite(grad).all()


def test_cross_entropy_gradient_matches_finite_differences() -> None:
    rng = np.random.default_rng(0)
    z = rng.standard_normal((5, 4))
    labels = rng.integers(0, 4, size=5)
    kind = LossKind.weighted_cross_entropy([0.5, 1.0, 2.0, 1.5])
    _, grad = kind.compute(z, labels)
    h = 1e-6
    num = np.zeros_like(z)
    for idx in np.ndindex(z.shape):
        zp, zm = z.copy(), z.copy()
        zp[idx] += h
        zm[idx] -= h
        num[idx] = (kind.compute(zp, labels)[0] - kind.compute(zm, labels)[0]) / (2 * h)
    np.testing.assert_allclose(grad, num, rtol=1e-6, atol=1e-9)


def test_bad_inputs_are_clear_errors() -> None:
    z = np.zeros((2, 3), dtype=np.float32)
    with pytest.raises(InvalidBatchError, match=r"in \[0, 3\)"):
        LossKind.CROSS_ENTROPY.compute(z, np.array([0, 3]))
    with pytest.raises(InvalidBatchError, match="integers"):
        LossKind.CROSS_ENTROPY.compute(z, np.array([0.0, 1.0]))
    with pytest.raises(InvalidBatchError, match="shape"):
        LossKind.MSE.compute(z, np.zeros((2, 2), dtype=np.float32))
    with pytest.raises(InvalidBatchError, match="class weights"):
        LossKind.weighted_cross_entropy([1.0, 2.0]).compute(z, np.array([0, 1]))
    for bad in ([], [-1.0, 1.0], [0.0, 0.0], [float("nan"), 1.0]):
        with pytest.raises(ValueError):
            LossKind.weighted_cross_entropy(bad)
    with pytest.raises(ValueError, match="unknown loss"):
        LossKind("hinge")


@pytest.mark.parametrize(
    ("loss", "targets", "needle"),
    [
        (LossKind.CROSS_ENTROPY, np.eye(3, dtype=np.float32)[[0, 2]], r"labels.argmax\(axis=1\)"),
        (LossKind.CROSS_ENTROPY, np.eye(3, dtype=np.int64)[[0, 2]], r"labels.argmax\(axis=1\)"),
        (LossKind.MSE, np.array([0, 2]), "look like class labels: LossKind.CROSS_ENTROPY"),
        (LossKind.MSE, np.zeros(2, dtype=np.float32), r"reshape them to \(2, 1\)"),
    ],
    ids=["one-hot-float", "one-hot-int", "mse-class-labels", "mse-one-output-1d"],
)
def test_targets_shaped_for_the_other_loss_say_what_to_write(
    loss: LossKind, targets: np.ndarray, needle: str
) -> None:
    """One-hot rows given to cross-entropy, class labels given to MSE, or a
    single output's targets without their column: the refusal says what to
    pass instead."""
    width = 1 if "reshape" in needle else 3
    with pytest.raises(InvalidBatchError, match=needle):
        loss.validate_targets(targets, 2, width)


def test_config_round_trip() -> None:
    for kind in (LossKind.MSE, LossKind.CROSS_ENTROPY, LossKind.weighted_cross_entropy([1, 2])):
        assert LossKind.from_config(kind.to_config()) == kind


def test_from_config_keeps_the_name_and_checks_weights() -> None:
    """An MSE config carrying class weights is an error, not weighted CE; a
    directly built `LossKind` gets the same weight checks as the factory."""
    with pytest.raises(ValueError, match="class_weights only apply to cross-entropy"):
        LossKind.from_config({"name": "mse", "class_weights": [1.0, 2.0]})
    for bad in ((), (-1.0, 2.0), (1.0, -3.6e-66), (0.0, 0.0), (float("inf"), 1.0)):
        with pytest.raises(ValueError, match="class_weights"):
            LossKind("cross_entropy", bad)
    kind = LossKind.from_config({"name": "cross_entropy", "class_weights": [1, 2]})
    assert kind == LossKind.weighted_cross_entropy([1.0, 2.0])
    assert kind.class_weights == (1.0, 2.0)


def test_class_weights_are_checked_in_the_dtype_they_are_computed_in() -> None:
    """A weight of 1e39 is finite in float64: the kind takes it, a float64
    computation uses it (torch's weighted mean), float32 refuses it naming
    the weight, its class and the dtype (its kernel would compute with inf)."""
    kind = LossKind.weighted_cross_entropy([1e39, 1.0, 2.0])
    kind.check_dtype(np.float64)
    with pytest.raises(
        ValueError, match="weight 1e[+]39 of class 0 is refused; .* finite in float32"
    ):
        kind.check_dtype(np.float32)
    rng = np.random.default_rng(3)
    z, labels = rng.standard_normal((6, 3)), np.array([0, 1, 2, 0, 2, 1])
    value, grad = kind.compute(z, labels)
    want, want_grad = ref_cross_entropy(z, labels, np.array([1e39, 1.0, 2.0]))
    assert math.isclose(value, want, rel_tol=1e-12)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-10, atol=1e-300)
    with pytest.raises(ValueError, match="finite in float32"):
        kind.compute(z.astype(np.float32), labels)


def test_a_class_weight_that_rounds_to_0_in_the_model_s_dtype_is_refused() -> None:
    """1e-50 became 0 in float32, dropping its class from the loss without a
    word; refused as `given_in` refuses a hyperparameter that rounds to 0. A
    float64 computation keeps it (torch's weighted mean); a weight given as 0
    is still taken."""
    kind = LossKind.weighted_cross_entropy([1.0, 1e-50, 2.0])
    kind.check_dtype(np.float64)
    message = "class_weights[1]=1e-50 rounds to 0 in float32; give 0 or a value >= 1.18e-38"
    with pytest.raises(ValueError) as info:
        kind.check_dtype(np.float32)
    assert str(info.value).startswith(message)
    z, labels = np.random.default_rng(4).standard_normal((4, 3)), np.array([1, 1, 0, 2])
    value, grad = kind.compute(z, labels)
    want, want_grad = ref_cross_entropy(z, labels, np.array([1.0, 1e-50, 2.0]))
    assert math.isclose(value, want, rel_tol=1e-12)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-10, atol=1e-300)
    with pytest.raises(ValueError, match=re.escape(message)):
        kind.compute(z.astype(np.float32), labels)
    LossKind.weighted_cross_entropy([0.0, 1.0]).check_dtype(np.float32)


@pytest.mark.parametrize(
    ("weights", "error", "message"),
    [
        ([True, 1.0], TypeError, "class_weights[0] must be a real number, got bool"),
        ([1.0, "2"], TypeError, "class_weights[1] must be a real number, got str"),
        (np.array([True, False]), TypeError, "class_weights[0] must be a real number, got bool"),
        (np.ones((1, 2)), TypeError, "class_weights must be a list, tuple or 1-D array"),
        ([Fraction(1, 10**400), 1.0], ValueError, "rounds to 0 in float64; give 0 or a value"),
        ([10**400, 1.0], ValueError, "class_weights[0] must be finite in float64, got 1000"),
    ],
)
def test_class_weights_are_real_numbers_given_in_float64(
    weights: Any, error: type, message: str
) -> None:
    """Bools and strings were taken as numbers ("2" as 2.0), a 2-D array was
    flattened, Fraction(1, 10**400) silently became a weight of 0 and
    10**400 an OverflowError: each entry is a scalar given in float64
    (`given_in`), by the factory, the constructor and `from_config`."""
    for build in (
        LossKind.weighted_cross_entropy,
        lambda w: LossKind("cross_entropy", w),
        lambda w: LossKind.from_config({"name": "cross_entropy", "class_weights": w}),
    ):
        with pytest.raises(error) as info:
            build(weights)
        assert message in str(info.value)
    kind = LossKind.weighted_cross_entropy([Fraction(1, 3), np.int64(2), np.float32(0.5)])
    assert kind.class_weights == (1 / 3, 2.0, 0.5)


def test_a_class_weight_below_the_smallest_normal_number_is_refused() -> None:
    """The mean loss's gradient is the sum's times 1 / (the labelled rows'
    weight sum), in the model's dtype: with float32 weights of 1e-39
    (subnormal) that reciprocal is infinite, and `compute` gave an all-inf
    gradient (a trainer refused the step as a non-finite gradient) where
    torch's weighted mean gives the finite one. Refused where weights are
    checked, with the least weight a dtype takes; float64 holds 1e-39."""
    kind = LossKind.weighted_cross_entropy([1e-39, 1.0])
    kind.check_dtype(np.float64)
    message = "class_weights[0]=1e-39 is subnormal in float32; give 0 or a value >= 1.18e-38"
    with pytest.raises(ValueError, match=re.escape(message)):
        kind.check_dtype(np.float32)
    z, labels = np.random.default_rng(5).standard_normal((2, 2)), np.array([0, 0])
    value, grad = kind.compute(z, labels)
    want, want_grad = ref_cross_entropy(z, labels, np.array([1e-39, 1.0]))
    assert math.isclose(value, want, rel_tol=1e-12)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-10)
    with pytest.raises(ValueError, match=re.escape(message)):
        kind.compute(z.astype(np.float32), labels)
    LossKind.weighted_cross_entropy([np.finfo(np.float32).tiny, 0.0]).check_dtype(np.float32)
