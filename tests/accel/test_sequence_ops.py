"""The sequence-model kernels (`atomr.accel.sequence_ops`) on every backend:
each layer's forward and backward in float32 on the backend equals the
float64 CPU computation, and dropout draws the same mask everywhere. The
CUDA cases run under the simulator lane with tiny shapes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from atomr.train.core._cpu import cpu_backend
from atomr.train.core.model import (
    CausalSelfAttention,
    Dropout,
    Embedding,
    ForwardContext,
    Layer,
    LayerNorm,
)

CTX = ForwardContext(train=True, step=3, sample_offset=2)


def _run(
    be: Any, layer: Layer, params: list[np.ndarray], x: np.ndarray, dy: np.ndarray, dtype: Any
) -> list[np.ndarray]:
    """Forward and backward of `layer` on `be` in `dtype`: output, input grad, param grads."""

    def to(a: np.ndarray) -> Any:
        return be.to_device(np.ascontiguousarray(a, dtype=dtype))

    p = [to(a) for a in params]
    xd = be.to_device(x) if x.dtype.kind == "i" else to(x)
    y, saved = layer.forward(be, p, xd, CTX)
    grads = [be.zeros(a.shape, dtype=dtype) for a in params]
    dx = layer.backward(be, p, grads, saved, to(dy), False, x.dtype.kind != "i")
    out = [np.asarray(be.to_host(y)), *(np.asarray(be.to_host(g)) for g in grads)]
    if dx is not None:
        out.append(np.asarray(be.to_host(dx)))
    return out


@pytest.mark.parametrize(
    ("layer", "shape", "tokens"),
    [
        (LayerNorm(6), (3, 4, 6), None),
        (CausalSelfAttention(8, 2), (2, 5, 8), None),
        (Embedding(7, 4, context=6), (2, 5), 7),
        (Dropout(0.4, seed=9), (3, 10), None),
        # edge shapes: one row of width 1, one token, one head of width 1,
        # heads of width 1, a vocabulary of 2 with one position
        (LayerNorm(1), (1, 1, 1), None),
        (CausalSelfAttention(1, 1), (1, 1, 1), None),
        (CausalSelfAttention(4, 4), (1, 3, 4), None),
        (Embedding(2, 1, context=1), (1, 1), 2),
    ],
    ids=[
        *("layernorm", "attention", "embedding", "dropout"),
        *("layernorm-d1", "attention-T1-d1", "attention-dh1", "embedding-vocab2"),
    ],
)
def test_the_backend_equals_float64_on_the_cpu(be, rng, layer, shape, tokens) -> None:
    params = [a + 0.1 * rng.standard_normal(a.shape) for a in layer.init_params(rng)]
    x = rng.integers(0, tokens, size=shape) if tokens else rng.standard_normal(shape)
    y_shape = (*shape, layer.out_shape(shape[1:])[-1]) if tokens else shape
    dy = rng.standard_normal(y_shape)
    got = _run(be, layer, params, x, dy, np.float32)
    want = _run(cpu_backend(), layer, params, x, dy, np.float64)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-5)


def test_layernorm_backward_uses_the_forward_row_mean_unrounded(be, rng) -> None:
    # rows far from 0 with a small spread: the float32 mean of [1e8, 1e8 + 8]
    # rounds to one end, and a backward from that kept mean saw xhat = [0, 2]
    # (the forward's is [-1, 1]); at 1000 +- 0.01 its gradients were off by 0.3 %
    layer = LayerNorm(8)
    params = [a + 0.1 * rng.standard_normal(a.shape) for a in layer.init_params(rng)]
    x = np.concatenate([1e3 + 1e-2 * rng.standard_normal((3, 8)), np.tile([1e8, 1e8 + 8], (1, 4))])
    x = x.astype(np.float32).astype(np.float64)  # the same inputs in both dtypes
    dy = rng.standard_normal(x.shape)
    got = _run(be, layer, params, x, dy, np.float32)
    want = _run(cpu_backend(), layer, params, x, dy, np.float64)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5 * np.abs(w).max())


def test_layernorm_of_a_constant_row_and_of_huge_rows_equals_float64(be, rng) -> None:
    # variance 0 (y is beta, dx is rstd * (g - mean(g)) with rstd = 1/sqrt(eps)),
    # and rows near float32's limit, whose squares only float64 holds
    layer = LayerNorm(4)
    params = [a + 0.1 * rng.standard_normal(a.shape) for a in layer.init_params(rng)]
    x = np.array([[3.0] * 4, [-1e30, 2e30, 0.5e30, 1e30], [3e38, -3e38, 1e38, 0.0]])
    x = x.astype(np.float32).astype(np.float64)
    dy = rng.standard_normal(x.shape)
    got = _run(be, layer, params, x, dy, np.float32)
    want = _run(cpu_backend(), layer, params, x, dy, np.float64)
    for g, w in zip(got, want, strict=True):
        assert np.isfinite(g).all()
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6 * np.abs(w).max())
