"""The sequence kernels' sums are float64 on every target, against float64
NumPy references: ``1e8 + 1 - 1e8`` is 1 (LayerNorm's row and column sums,
the embedding gradients, attention's CUDA sums), and a kept dropout element is
``x * scale`` rounded once. The CUDA simulator added the float32 terms in
float32 (NumPy 2's rule for a float32 scalar plus a Python float) and got 0,
unlike a GPU. Tiny shapes: the CUDA cases run under the simulator lane."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
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


def test_embedding_gradients_sum_in_float64(be) -> None:
    ids = put(be, np.zeros(3, np.int64))  # one token three times, t_len 1: one position
    dy = np.array(CANCELS)[:, None]
    dtokens, dpositions = _f32(be, [[0.5], [0.5]]), _f32(be, [[0.5]])
    sequence_ops.embedding_backward(be, ids, _f32(be, dy), dtokens, dpositions, 1, True)
    np.testing.assert_allclose(get(be, dtokens), [[1.5], [0.5]], rtol=1e-6)
    np.testing.assert_allclose(get(be, dpositions), [[1.5]], rtol=1e-6)


def test_dropout_rounds_x_times_the_float64_scale_once(be) -> None:
    x = np.random.default_rng(0).standard_normal(64).astype(np.float32)
    y, p = _f32(be, np.zeros(64)), 0.1
    sequence_ops.dropout_apply(be, _f32(be, x), y, 64, 0, 1, 5, p)
    got = get(be, y)
    kept = got != 0
    assert 0 < kept.sum() < 64
    want = (x.astype(np.float64) / (1.0 - p)).astype(np.float32)
    np.testing.assert_array_equal(got[kept], want[kept])


def _attention_ref(qkv: np.ndarray, dout: np.ndarray, scale: float) -> list[np.ndarray]:
    """One batch, one head, float64: o, P and dqkv."""
    q, k, v = (qkv[:, i : i + 1].astype(np.float64) for i in range(3))
    s = np.where(np.tril(np.ones((3, 3), bool)), scale * q @ k.T, -np.inf)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    dp = dout @ v.T
    ds = p * (dp - (p * dp).sum(axis=1, keepdims=True))
    return [p @ v, p, np.hstack([scale * ds @ k, scale * ds.T @ q, p.T @ dout])]


@pytest.mark.parametrize(
    ("k", "v", "dout"),
    [
        ([0.0, 0.0, 0.0], CANCELS, [0.0, 0.0, 0.0]),  # o[2] = (1e8 + 1 - 1e8) / 3
        ([-1e8, 1.0, 1e8], [-1.0, 2.0, -1.0], [0.0, 0.0, 1.0]),  # dq[2] = 2/3 scale
        ([0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [1e8, 2.0, -3e8]),  # dv[0] = 1e8 + 1 - 1e8
    ],
    ids=["output", "query-grad", "value-grad"],
)
def test_attention_sums_in_float64(cuda_be, k, v, dout) -> None:
    """The CUDA kernels' sums (the CPU twin is float32 BLAS); q = 0: equal weights."""
    be, scale = cuda_be, 0.5
    qkv = np.array([[0.0] * 3, k, v], np.float32).T.copy()
    do = np.array(dout, np.float32)[:, None]
    p, o, ds, dqkv = (_f32(be, np.zeros(s)) for s in ((1, 3, 3), (3, 1), (1, 3, 3), (3, 3)))
    sequence_ops.attention_forward(be, _f32(be, qkv), p, o, 1, scale)
    sequence_ops.attention_backward(be, _f32(be, qkv), p, _f32(be, do), ds, dqkv, 1, scale)
    want_o, want_p, want_dqkv = _attention_ref(qkv, do.astype(np.float64), scale)
    np.testing.assert_allclose(get(be, o), want_o, rtol=1e-6, atol=1e-30)
    np.testing.assert_allclose(get(be, p)[0], want_p, rtol=1e-6)
    np.testing.assert_allclose(get(be, dqkv), want_dqkv, rtol=1e-6, atol=1e-30)
