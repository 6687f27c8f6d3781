"""Activations (forward, backward), bias add, axpy and scale against NumPy, on every backend."""

from __future__ import annotations

import math

import numpy as np
import pytest
from accel_helpers import get, put, rand, tol
from hypothesis import given, settings
from hypothesis import strategies as st

from atomr.accel import ACTIVATIONS, Backend, backend_for

SHAPES = [(1,), (1, 1), (7,), (3, 5), (2, 3, 4), (8, 8)]
K = math.sqrt(2.0 / math.pi)


def ref_forward(kind: str, x: np.ndarray, ref: type = np.float64) -> np.ndarray:
    x = x.astype(ref)
    if kind == "relu":
        return np.maximum(x, 0.0)
    if kind == "tanh":
        return np.tanh(x)
    if kind == "gelu":
        return 0.5 * x * (1.0 + np.tanh(K * (x + 0.044715 * x**3)))
    return x


def ref_backward(kind: str, x: np.ndarray, dy: np.ndarray, ref: type = np.float64) -> np.ndarray:
    x = x.astype(ref)
    dy = dy.astype(ref)
    if kind == "relu":
        return dy * (x > 0)
    if kind == "tanh":
        return dy * (1.0 - np.tanh(x) ** 2)
    if kind == "gelu":
        t = np.tanh(K * (x + 0.044715 * x**3))
        return dy * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * K * (1 + 3 * 0.044715 * x * x))
    return dy


@pytest.mark.parametrize("kind", list(ACTIVATIONS))
@pytest.mark.parametrize("shape", SHAPES)
def test_activation_forward_backward(be, rng, kind, shape):
    x = rand(rng, *shape) * 3
    dy = rand(rng, *shape)
    out = put(be, np.full(shape, np.nan, np.float32))
    dx = put(be, np.full(shape, np.nan, np.float32))
    xb = put(be, x)
    be.activation_forward(kind, xb, out)
    be.activation_backward(kind, xb, put(be, dy), dx)
    np.testing.assert_allclose(get(be, out), ref_forward(kind, x), **tol(np.float32))
    np.testing.assert_allclose(get(be, dx), ref_backward(kind, x, dy), **tol(np.float32))


@pytest.mark.parametrize("kind", ["tanh", "gelu"])
def test_activation_backward_matches_finite_differences(kind, rng):
    """The backward formulas are the derivative of the forward ones (float64, CPU)."""
    be = backend_for("cpu:0")
    x = rng.standard_normal(50) * 3
    h = 1e-6
    up, down, dx = np.empty_like(x), np.empty_like(x), np.empty_like(x)
    be.activation_forward(kind, x + h, up)
    be.activation_forward(kind, x - h, down)
    be.activation_backward(kind, x, np.ones_like(x), dx)
    np.testing.assert_allclose(dx, (up - down) / (2 * h), rtol=1e-6, atol=1e-8)


def test_gelu_is_torch_tanh_approximation():
    """Known values of torch.nn.functional.gelu(x, approximate='tanh')."""
    be = backend_for("cpu:0")
    x = np.array([-3.0, -1.0, 0.0, 0.5, 1.0, 2.0])
    out = np.empty_like(x)
    be.activation_forward("gelu", x, out)
    expected = [-0.0036373921, -0.15880801, 0.0, 0.34571401, 0.84119199, 1.95459769]
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-8)
    exact_erf_gelu = 0.5 * x * (1.0 + np.array([math.erf(v / math.sqrt(2.0)) for v in x]))
    assert abs(out[0] - exact_erf_gelu[0]) > 1e-4  # the tanh approximation, not erf


def test_activation_in_place(be, rng):
    x = rand(rng, 4, 3)
    xb = put(be, x)
    be.activation_forward("relu", xb, xb)
    np.testing.assert_allclose(get(be, xb), np.maximum(x, 0))


@pytest.mark.parametrize("rows,cols", [(1, 1), (1, 5), (5, 1), (3, 7), (8, 8)])
def test_bias_add(be, rng, rows, cols):
    x, b = rand(rng, rows, cols), rand(rng, cols)
    xb = put(be, x)
    be.bias_add(xb, put(be, b))
    np.testing.assert_allclose(get(be, xb), x + b, **tol(np.float32))


@pytest.mark.parametrize("n", [1, 2, 33, 64])
def test_axpy_and_scale(be, rng, n):
    x, y = rand(rng, n), rand(rng, n)
    yb = put(be, y)
    be.axpy(-0.75, put(be, x), yb)
    np.testing.assert_allclose(get(be, yb), y - 0.75 * x, **tol(np.float32))
    be.scale(yb, 3.0)
    np.testing.assert_allclose(get(be, yb), 3.0 * (y - 0.75 * x), **tol(np.float32))


@settings(max_examples=25, deadline=None)
@given(
    kind=st.sampled_from(list(ACTIVATIONS)),
    n=st.integers(1, 3000),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 2**32 - 1),
)
def test_cpu_elementwise_random(kind, n, dtype, seed):
    be = backend_for("cpu:0")
    rng = np.random.default_rng(seed)
    x, dy = rand(rng, n, dtype=dtype) * 4, rand(rng, n, dtype=dtype)
    out, dx = np.empty_like(x), np.empty_like(x)
    be.activation_forward(kind, x, out)
    be.activation_backward(kind, x, dy, dx)
    np.testing.assert_allclose(out, ref_forward(kind, x), **tol(dtype))
    np.testing.assert_allclose(dx, ref_backward(kind, x, dy), **tol(dtype))
    y = dy.copy()
    be.axpy(0.5, x, y)
    np.testing.assert_allclose(y, dy.astype(np.float64) + 0.5 * x, **tol(dtype))


def test_relu_propagates_nan_like_numpy_and_torch(be):
    """relu(NaN) is NaN (np.maximum, torch.relu), as every other activation; its gradient is 0."""
    x = np.array([np.nan, -1.0, 2.0, -np.inf, np.inf, -0.0], np.float32)
    out = put(be, np.zeros_like(x))
    dx = put(be, np.full_like(x, 7.0))
    xb = put(be, x)
    be.activation_forward("relu", xb, out)
    be.activation_backward("relu", xb, put(be, np.ones_like(x)), dx)
    np.testing.assert_array_equal(get(be, out), np.maximum(x, 0))
    np.testing.assert_array_equal(get(be, dx), (x > 0).astype(np.float32))


def test_gelu_far_left_tail_is_zero_not_an_overflow(be):
    """GELU and its gradient vanish for very negative x (torch's are 0 there),
    in every float dtype the backend computes in.

    The tail's exponent was clamped, so x / (1 + exp(clamp)) grew with |x| and the
    backward's x * exp(clamp) overflowed: -inf in float32 from x ~ -3e3, and
    -3.9e24 in float64 at -1e20.
    """
    for dtype in be.float_dtypes:
        x = np.array([-9.0, -10.0, -100.0, -3.1e3, -1e4, -1e6, -1e20, -3e38], dtype)
        out, dx = _gelu(be, x, np.ones_like(x))
        np.testing.assert_allclose(out, 0.0, atol=1e-26)  # gelu(-9) is -1.3e-28
        np.testing.assert_allclose(dx, 0.0, atol=1e-26)


def _gelu(be: Backend, x: np.ndarray, dy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """gelu(x) and dy * gelu'(x) on ``be``, as host arrays."""
    out = put(be, np.full_like(x, np.nan))
    dx = put(be, np.full_like(x, np.nan))
    xb = put(be, x)
    be.activation_forward("gelu", xb, out)
    be.activation_backward("gelu", xb, put(be, dy), dx)
    return get(be, out), get(be, dx)


def _gelu_inputs(dtype: type) -> np.ndarray:
    """0, and both signs of: tiny values (results still normal), ordinary
    ones, the saturation point 9.5 and its neighbours, and huge ones up to
    near the dtype's largest (where x^2 and x^3 overflow)."""
    mags = [1e-37, 1e-30, 1e-7, 1e-3, 0.5, 1.0, 3.0, 9.4, 9.5, 9.6, 20.0, 1e3]
    mags += [1e12, 1e13, 1.8e19, 1e20, 1e30, 3e38]
    if dtype == np.float64:
        mags += [1e-300, 1e102, 1e154, 1e200, 1.7e308]
    return np.array([0.0, *mags, *(-m for m in mags)], dtype)


def test_gelu_is_finite_and_right_across_the_float_range(be):
    """Forward and backward against NumPy in float64 (in extended precision
    for float64 inputs, whose cubes overflow float64), from tiny to the
    dtype's largest values, and at +-inf and NaN.

    x^2 and x^3 overflowed for huge x: the backward was NaN (float32 from
    x ~ 1.8e19, float64 from ~1e154) and, on the CPU's float32 path, 4.5 at
    x = 1e13 and inf from 2e19 instead of 1.
    """
    for dtype in be.float_dtypes:
        x = _gelu_inputs(dtype)
        ref = np.float64 if dtype == np.float32 else np.longdouble
        if np.finfo(ref).max < 1e1000 and dtype == np.float64:
            x = x[np.abs(x) < 1e100]  # no wider float here to check the rest against
        dy = np.full_like(x, 0.75)
        out, dx = _gelu(be, x, dy)
        tail = x < -9.0  # gelu and its slope are below 1e-29 there, 0 for training
        rtol = tol(dtype)["rtol"]
        for got, want in (
            (out, ref_forward("gelu", x, ref)),
            (dx, ref_backward("gelu", x, dy, ref)),
        ):
            assert np.isfinite(got).all(), (x[~np.isfinite(got)], got[~np.isfinite(got)])
            np.testing.assert_allclose(
                got[~tail], want[~tail].astype(np.float64), rtol=rtol, atol=0
            )
            np.testing.assert_allclose(got[tail], want[tail].astype(np.float64), atol=1e-29)
        special = np.array([np.inf, -np.inf, np.nan], dtype)
        out, dx = _gelu(be, special, np.ones_like(special))
        np.testing.assert_allclose(out, [np.inf, 0.0, np.nan], atol=1e-29)
        np.testing.assert_allclose(dx, [1.0, 0.0, np.nan], atol=1e-29)
