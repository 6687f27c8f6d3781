"""LayerNorm's row and column sums are float64 on every target, against a
float64 NumPy reference: ``1e8 + 1 - 1e8`` is 1, where the CUDA simulator
added the float32 terms in float32 (NumPy 2's rule for a float32 scalar plus
a Python float) and got 0, unlike a GPU. Tiny shapes: the CUDA cases run
under the simulator lane."""

from __future__ import annotations

from typing import Any

import numpy as np
from accel_helpers import get, put

from atomr.accel import sequence_ops

CANCELS = [1e8, 1.0, -1e8]  # float32 values whose float32 sum is 0, float64 sum 1


def _f32(be: Any, a: Any) -> Any:
    return put(be, np.asarray(a, np.float32))


def test_forward_sums_the_row_in_float64(be) -> None:
    x = np.array([CANCELS], np.float32)
    gamma, beta = np.array([1.0, 2.0, 0.5], np.float32), np.array([0.0, 1.0, -1.0], np.float32)
    y, mean, rstd = _f32(be, np.zeros((1, 3))), _f32(be, [0.0]), _f32(be, [0.0])
    eps = 1e-5
    sequence_ops.layernorm_forward(
        be, _f32(be, x), _f32(be, gamma), _f32(be, beta), y, mean, rstd, eps
    )
    x64 = x.astype(np.float64)
    m = x64.mean(axis=1)
    inv = 1.0 / np.sqrt(((x64 - m[:, None]) ** 2).mean(axis=1) + eps)
    want = (x64 - m[:, None]) * inv[:, None] * gamma + beta
    np.testing.assert_allclose(get(be, mean), m, rtol=1e-6)
    np.testing.assert_allclose(get(be, rstd), inv, rtol=1e-6)
    np.testing.assert_allclose(get(be, y), want, rtol=1e-6)


def test_input_gradient_sums_the_row_in_float64(be) -> None:
    x, mean, rstd = np.array([[-1.0, 0.0, 1.0]]), np.array([0.0]), np.array([1.0])
    gamma, dy = np.ones(3), np.array([CANCELS])
    dx, dgamma, dbeta = _f32(be, np.zeros((1, 3))), _f32(be, np.zeros(3)), _f32(be, np.zeros(3))
    args = [_f32(be, a) for a in (x, gamma, mean, rstd, dy)]
    sequence_ops.layernorm_backward(be, *args, dx, dgamma, dbeta, False)
    xhat = (x - mean[:, None]) * rstd[:, None]
    g = dy * gamma
    want = rstd[:, None] * (
        g - g.mean(axis=1, keepdims=True) - xhat * (g * xhat).mean(axis=1, keepdims=True)
    )
    np.testing.assert_allclose(get(be, dx), want, rtol=1e-6)


def test_parameter_gradients_sum_the_column_in_float64(be) -> None:
    x, mean, rstd = np.array([[-1.0], [0.0], [1.0]]), np.zeros(3), np.full(3, 2.0)
    dy = np.array(CANCELS)[:, None]
    dgamma, dbeta = _f32(be, [0.5]), _f32(be, [0.5])
    args = [_f32(be, a) for a in (x, np.ones(1), mean, rstd, dy)]
    sequence_ops.layernorm_backward(be, *args, None, dgamma, dbeta, True)
    want_dgamma = 0.5 + (dy * (x - mean[:, None]) * rstd[:, None]).sum(axis=0)
    np.testing.assert_allclose(get(be, dgamma), want_dgamma, rtol=1e-6)
    np.testing.assert_allclose(get(be, dbeta), 0.5 + dy.sum(axis=0), rtol=1e-6)
