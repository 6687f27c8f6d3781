"""bias_grad, sum_into and squared_norm against NumPy, on every backend."""

from __future__ import annotations

import numpy as np
import pytest
from accel_helpers import get, put, rand, tol
from hypothesis import given, settings
from hypothesis import strategies as st

from atomr.accel import backend_for


@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("rows,cols", [(1, 1), (1, 4), (5, 1), (7, 3), (8, 8)])
def test_bias_grad(be, rng, rows, cols, accumulate):
    dy, start = rand(rng, rows, cols), rand(rng, cols)
    out = put(be, start)
    be.bias_grad(put(be, dy), out, accumulate=accumulate)
    expected = dy.astype(np.float64).sum(axis=0) + (start if accumulate else 0)
    np.testing.assert_allclose(get(be, out), expected, **tol(np.float32))


@pytest.mark.parametrize("accumulate", [False, True])
def test_bias_grad_sums_each_column_in_float64(be, accumulate):
    # the CPU twin's float32 running sum gave 0 for 1e8 + 1 - 1e8 (and for
    # out = 1e8 plus 1 and -1e8); the CUDA kernel's float64 sum gives 1
    dy = np.array([[1.0, 3.0], [1e8, 1.0], [1.0, -3.0], [-1e8, 0.0]], np.float32)
    start = np.array([-1.0, 2**-22], np.float32)
    out = put(be, start)
    be.bias_grad(put(be, dy), out, accumulate=accumulate)
    expected = dy.astype(np.float64).sum(axis=0) + (start if accumulate else 0)
    np.testing.assert_array_equal(get(be, out), expected.astype(np.float32))


@pytest.mark.parametrize("k", [1, 2, 3, 5])
@pytest.mark.parametrize("shape", [(1,), (7,), (3, 4)])
def test_sum_into(be, rng, k, shape):
    bufs = [rand(rng, *shape) for _ in range(k)]
    out = put(be, np.full(shape, np.nan, np.float32))
    be.sum_into(out, [put(be, b) for b in bufs])
    np.testing.assert_allclose(
        get(be, out), np.sum(bufs, axis=0, dtype=np.float64), **tol(np.float32)
    )


@pytest.mark.parametrize("position", [0, 1, 2])
def test_sum_into_out_among_buffers(be, rng, position):
    host = [rand(rng, 6) for _ in range(3)]
    dev = [put(be, b) for b in host]
    be.sum_into(dev[position], dev)
    np.testing.assert_allclose(
        get(be, dev[position]), np.sum(host, axis=0, dtype=np.float64), **tol(np.float32)
    )


@pytest.mark.parametrize("shape", [(1,), (2,), (31,), (3, 5), (300,)])
def test_squared_norm(be, rng, shape):
    x = rand(rng, *shape)
    got = be.squared_norm(put(be, x))
    assert isinstance(got, float)
    assert got == pytest.approx(float(np.sum(x.astype(np.float64) ** 2)), rel=1e-6)


def test_squared_norm_of_empty_is_zero(be):
    assert be.squared_norm(put(be, np.zeros(0, np.float32))) == 0.0


@settings(max_examples=20, deadline=None)
@given(
    n=st.integers(1, 5000),
    k=st.integers(1, 4),
    seed=st.integers(0, 2**32 - 1),
    dtype=st.sampled_from([np.float32, np.float64]),
)
def test_cpu_reductions_random(n, k, seed, dtype):
    be = backend_for("cpu:0")
    rng = np.random.default_rng(seed)
    bufs = [rand(rng, n, dtype=dtype) for _ in range(k)]
    out = np.empty(n, dtype)
    be.sum_into(out, bufs)
    np.testing.assert_allclose(out, np.sum(bufs, axis=0, dtype=np.float64), **tol(dtype))
    assert be.squared_norm(out) == pytest.approx(
        float(np.sum(out.astype(np.float64) ** 2)), rel=1e-9
    )
    dy = rand(rng, max(1, n // 7), 7, dtype=dtype)
    g = np.empty(7, dtype)
    be.bias_grad(dy, g)
    np.testing.assert_allclose(g, dy.astype(np.float64).sum(axis=0), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("shape", [(1,), (7,), (3, 4), (300,)])
def test_sum_scale_norm_equals_sum_into_then_scale(be, rng, k, shape):
    bufs = [rand(rng, *shape) for _ in range(k)]
    alpha = 1.0 / 3.0
    ref = put(be, np.full(shape, np.nan, np.float32))
    be.sum_into(ref, [put(be, b) for b in bufs])
    be.scale(ref, alpha)
    out = put(be, np.full(shape, np.nan, np.float32))
    got = be.sum_scale_norm(out, [put(be, b) for b in bufs], alpha)
    assert isinstance(got, float)
    np.testing.assert_array_equal(get(be, out), get(be, ref))
    expected = np.sum(bufs, axis=0, dtype=np.float64) * alpha
    np.testing.assert_allclose(get(be, out), expected, **tol(np.float32))
    assert got == pytest.approx(float(np.sum(get(be, ref).astype(np.float64) ** 2)), rel=1e-6)


@pytest.mark.parametrize(("k", "position"), [(1, 0), (2, 0), (2, 1)])
def test_sum_scale_norm_out_among_buffers(be, rng, k, position):
    host = [rand(rng, 9) for _ in range(k)]
    dev = [put(be, b) for b in host]
    got = be.sum_scale_norm(dev[position], dev, 0.5)
    expected = np.sum(host, axis=0, dtype=np.float64).astype(np.float32) * np.float32(0.5)
    np.testing.assert_array_equal(get(be, dev[position]), expected)
    assert got == pytest.approx(float(np.sum(expected.astype(np.float64) ** 2)), rel=1e-6)


def test_sum_scale_norm_of_non_finite_is_not_finite(be):
    x = np.array([1.0, np.inf, 2.0], np.float32)
    assert not np.isfinite(be.sum_scale_norm(put(be, x.copy()), [put(be, x)], 1.0))


@settings(max_examples=20, deadline=None)
@given(
    n=st.integers(1, 5000),
    k=st.integers(1, 4),
    seed=st.integers(0, 2**32 - 1),
    dtype=st.sampled_from([np.float32, np.float64]),
)
def test_cpu_sum_scale_norm_random(n, k, seed, dtype):
    be = backend_for("cpu:0")
    rng = np.random.default_rng(seed)
    bufs = [rand(rng, n, dtype=dtype) for _ in range(k)]
    alpha = float(rng.uniform(0.01, 2.0))
    ref = np.empty(n, dtype)
    be.sum_into(ref, bufs)
    be.scale(ref, alpha)
    out = np.empty(n, dtype)
    got = be.sum_scale_norm(out, bufs, alpha)
    np.testing.assert_array_equal(out, ref)
    assert got == pytest.approx(float(np.sum(ref.astype(np.float64) ** 2)), rel=1e-9)


def test_sum_into_out_aliased_through_a_view(be, rng):
    """A buffer that is out's memory under another array object counts as out."""
    x, y = rand(rng, 2, 3), rand(rng, 2, 3)
    out, yb = put(be, x), put(be, y)
    be.sum_into(out, [yb, out.reshape(6).reshape(2, 3)])
    np.testing.assert_allclose(get(be, out), x + y, **tol(np.float32))
    out = put(be, x)
    norm = be.sum_scale_norm(out, [yb, out.reshape(6).reshape(2, 3)], 0.5)
    expected = (x + y) * np.float32(0.5)
    np.testing.assert_allclose(get(be, out), expected, **tol(np.float32))
    assert norm == pytest.approx(float(np.sum(expected.astype(np.float64) ** 2)), rel=1e-5)


@pytest.mark.parametrize("position", [None, 0, 2])
def test_sum_of_three_or_more_buffers_is_rounded_once(be, position):
    # 1e8 + 1 - 1e8: a float32 running sum (the CUDA kernel's) lost the 1;
    # both targets add in float64 and round once, as NumPy's float64 sum
    host = [np.array([1e8, 3.0], np.float32), np.array([1.0, 2**-22], np.float32)]
    host += [np.array([-1e8, -3.0], np.float32), np.array([0.0, 2**-22], np.float32)]
    dev = [put(be, b) for b in host]
    out = put(be, np.full(2, np.nan, np.float32)) if position is None else dev[position]
    expected = np.sum(host, axis=0, dtype=np.float64).astype(np.float32)
    be.sum_into(out, dev)
    np.testing.assert_array_equal(get(be, out), expected)
    dev = [put(be, b) for b in host]
    out = put(be, np.full(2, np.nan, np.float32)) if position is None else dev[position]
    be.sum_scale_norm(out, dev, 2.0)
    np.testing.assert_array_equal(get(be, out), expected * np.float32(2.0))
