"""Fused softmax cross-entropy and MSE against NumPy, on every backend."""

from __future__ import annotations

import numpy as np
import pytest
from accel_helpers import get, put, rand, tol
from hypothesis import given, settings
from hypothesis import strategies as st

import atomr.accel.cpu_backend
from atomr.accel import backend_for


def ref_ce(logits, labels, weights):
    x = logits.astype(np.float64)
    n, c = x.shape
    w = np.ones(c) if weights is None else weights.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(x - m).sum(axis=1))
    wy = w[labels]
    loss = float(np.sum(wy * (lse - x[np.arange(n), labels])))
    p = np.exp(x - lse[:, None])
    onehot = np.zeros_like(p)
    onehot[np.arange(n), labels] = 1.0
    return loss, float(wy.sum()), wy[:, None] * (p - onehot)


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("n,c", [(1, 1), (1, 3), (4, 2), (7, 5), (8, 8)])
def test_softmax_cross_entropy(be, rng, n, c, weighted):
    logits = rand(rng, n, c) * 5
    labels = rng.integers(0, c, size=n)
    weights = rng.uniform(0.1, 2.0, size=c).astype(np.float32) if weighted else None
    grad = put(be, np.full((n, c), np.nan, np.float32))
    loss, wsum = be.softmax_cross_entropy(put(be, logits), labels, weights, grad)
    ref_loss, ref_wsum, ref_grad = ref_ce(logits, labels, weights)
    assert loss == pytest.approx(ref_loss, rel=1e-5, abs=1e-6)
    assert wsum == pytest.approx(ref_wsum, rel=1e-6)
    np.testing.assert_allclose(get(be, grad), ref_grad, **tol(np.float32))


def test_softmax_cross_entropy_is_stable_for_large_logits(be):
    logits = np.array([[1000.0, 0.0, -1000.0], [-500.0, 500.0, 0.0]], np.float32)
    grad = put(be, np.zeros_like(logits))
    loss, _ = be.softmax_cross_entropy(put(be, logits), np.array([0, 0]), None, grad)
    assert np.isfinite(loss) and loss == pytest.approx(1000.0, rel=1e-6)
    assert np.all(np.isfinite(get(be, grad)))


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # -3e38 - 3e38
@pytest.mark.parametrize("weighted", [False, True])
def test_softmax_cross_entropy_beyond_the_float32_range_is_finite(be, weighted):
    """The row loss is float64 on every target: 6e38 for label 1 of
    [3e38, -3e38, 0], not float32's inf (the CUDA simulator added it in float32)."""
    logits = np.array([[3e38, -3e38, 0.0], [-3e38, 0.0, 3e38]], np.float32)
    labels = np.array([1, 0])
    weights = np.array([0.5, 2.0, 1.0], np.float32) if weighted else None
    grad = put(be, np.full(logits.shape, np.nan, np.float32))
    loss, wsum = be.softmax_cross_entropy(put(be, logits), labels, weights, grad)
    ref_loss, ref_wsum, ref_grad = ref_ce(logits, labels, weights)
    assert np.isfinite(ref_loss)
    assert loss == pytest.approx(ref_loss, rel=1e-6)
    assert wsum == pytest.approx(ref_wsum, rel=1e-6)
    np.testing.assert_allclose(get(be, grad), ref_grad, **tol(np.float32))


def test_softmax_cross_entropy_grad_may_alias_logits(be, rng):
    logits = rand(rng, 3, 4)
    labels = np.array([3, 0, 1], np.int32)
    buf = put(be, logits)
    loss, _ = be.softmax_cross_entropy(buf, labels, None, buf)
    ref_loss, _, ref_grad = ref_ce(logits, labels, None)
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    np.testing.assert_allclose(get(be, buf), ref_grad, **tol(np.float32))


def test_softmax_cross_entropy_grad_is_the_derivative(rng):
    """Finite differences on the float64 CPU path: grad = d(loss_sum)/d(logits)."""
    be = backend_for("cpu:0")
    logits = rng.standard_normal((4, 3))
    labels = np.array([0, 2, 1, 2])
    weights = np.array([0.5, 2.0, 1.0])
    grad = np.empty_like(logits)
    be.softmax_cross_entropy(logits, labels, weights, grad)
    scratch = np.empty_like(logits)
    h = 1e-6
    for idx in np.ndindex(*logits.shape):
        up, down = logits.copy(), logits.copy()
        up[idx] += h
        down[idx] -= h
        lu, _ = be.softmax_cross_entropy(up, labels, weights, scratch)
        ld, _ = be.softmax_cross_entropy(down, labels, weights, scratch)
        assert grad[idx] == pytest.approx((lu - ld) / (2 * h), rel=1e-5, abs=1e-8)


@pytest.mark.parametrize("shape", [(1,), (1, 1), (9,), (3, 5), (8, 8)])
def test_mse(be, rng, shape):
    pred, target = rand(rng, *shape), rand(rng, *shape)
    grad = put(be, np.full(shape, np.nan, np.float32))
    loss = be.mse(put(be, pred), put(be, target), grad)
    diff = pred.astype(np.float64) - target
    assert loss == pytest.approx(float(np.sum(diff**2)), rel=1e-5)
    np.testing.assert_allclose(get(be, grad), 2 * diff, **tol(np.float32))


def test_mse_squares_in_float64(be):
    # a float32 difference squared in float32 overflowed (1e20 -> inf) or
    # underflowed (1e-30 -> 0), though the sum is float64
    pred = np.array([1e20, 1e-30, -0.0, 3.0], np.float32)
    target = np.array([0.0, 0.0, 0.0, 1.5], np.float32)
    grad = put(be, np.full(4, np.nan, np.float32))
    loss = be.mse(put(be, pred), put(be, target), grad)
    diff = pred.astype(np.float64) - target
    assert loss == pytest.approx(float(np.sum(diff**2)), rel=1e-12)
    np.testing.assert_array_equal(get(be, grad), 2 * (pred - target))


@settings(max_examples=20, deadline=None)
@given(
    n=st.integers(1, 200),
    c=st.integers(1, 40),
    weighted=st.booleans(),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 2**32 - 1),
)
def test_cpu_losses_random(n, c, weighted, dtype, seed):
    be = backend_for("cpu:0")
    rng = np.random.default_rng(seed)
    logits = rand(rng, n, c, dtype=dtype) * 3
    labels = rng.integers(0, c, size=n)
    weights = rng.uniform(0.0, 2.0, size=c) if weighted else None
    grad = np.empty_like(logits)
    loss, wsum = be.softmax_cross_entropy(logits, labels, weights, grad)
    ref_loss, ref_wsum, ref_grad = ref_ce(
        logits, labels, None if weights is None else weights.astype(dtype)
    )
    assert loss == pytest.approx(ref_loss, rel=1e-5, abs=1e-5)
    assert wsum == pytest.approx(ref_wsum, rel=1e-5)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-5, atol=1e-6)
    target = rand(rng, n, c, dtype=dtype)
    mloss = be.mse(logits, target, grad)
    assert mloss == pytest.approx(
        float(np.sum((logits.astype(np.float64) - target) ** 2)), rel=1e-5
    )


def test_softmax_cross_entropy_refuses_weights_or_labels_in_grads_memory():
    # grad is written row by row while weights and labels are read: weights
    # that are grad's first row changed under the kernel (loss 1.83, not 3 log 3)
    be = backend_for("cpu:0")
    logits = np.zeros((3, 3), np.float32)
    grad = np.ones((3, 3), np.float32)
    with pytest.raises(ValueError, match="grad shares memory with weights"):
        be.softmax_cross_entropy(logits, np.array([0, 1, 2]), grad[0], grad)
    np.testing.assert_array_equal(grad, 1.0)
    grad = np.zeros((4, 1), np.float32)
    labels = grad.view(np.int32).reshape(4)
    with pytest.raises(ValueError, match="grad shares memory with labels"):
        be.softmax_cross_entropy(np.zeros((4, 1), np.float32), labels, None, grad)
    # grad may still be logits itself
    loss, _ = be.softmax_cross_entropy(logits, np.array([0, 1, 2]), np.ones(3), logits)
    assert loss == pytest.approx(3 * np.log(3))


def test_softmax_cross_entropy_takes_big_endian_labels(be, rng):
    # labels read from a big-endian file ('>i4') passed the checks, then numba
    # refused their byte order with a TypingError (a DriverError on an actor)
    logits = rand(rng, 3, 4)
    labels = np.array([3, 0, 2], dtype=">i4")
    grad = put(be, np.full((3, 4), np.nan, np.float32))
    loss, wsum = be.softmax_cross_entropy(put(be, logits), labels, None, grad)
    ref_loss, ref_wsum, ref_grad = ref_ce(logits, labels.astype(np.int64), None)
    assert (loss, wsum) == (pytest.approx(ref_loss, rel=1e-5), ref_wsum)
    np.testing.assert_allclose(get(be, grad), ref_grad, **tol(np.float32))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_unweighted_cpu_cross_entropy_equals_unit_weights_and_allocates_none(dtype):
    """An unweighted call passed a fresh `np.ones(1)` to the kernel on every
    call; it now passes one array per dtype, which the kernel only reads."""
    be = backend_for("cpu:0")
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((6, 4)).astype(dtype)
    labels = np.array([0, 3, 1, 2, 3, 0])
    grad, unit_grad = np.empty_like(logits), np.empty_like(logits)
    got = be.softmax_cross_entropy_unchecked(logits, labels, None, grad)
    unit = be.softmax_cross_entropy_unchecked(logits, labels, np.ones(4, dtype), unit_grad)
    assert got == unit
    np.testing.assert_array_equal(grad, unit_grad)
    shared = atomr.accel.cpu_backend._NO_WEIGHTS[np.dtype(dtype)]
    assert shared.dtype == dtype and shared.tolist() == [1.0]  # read, never written
