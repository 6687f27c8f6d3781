"""Fused SGD / Adam / AdamW steps against a NumPy transcription of torch.optim, on every backend."""

from __future__ import annotations

import numpy as np
import pytest
from accel_helpers import get, put, rand
from hypothesis import given, settings
from hypothesis import strategies as st

from atomr.accel import AdamHyperparameters, SgdHyperparameters, backend_for

STEPS = 4


def ref_sgd(p, grads, lr, momentum, dampening, weight_decay, nesterov):
    """torch.optim.SGD._single_tensor_sgd, in float64."""
    p = p.astype(np.float64)
    buf = None
    for g in grads:
        d = g.astype(np.float64)
        if weight_decay:
            d = d + weight_decay * p
        if momentum:
            buf = d.copy() if buf is None else momentum * buf + (1 - dampening) * d
            d = d + momentum * buf if nesterov else buf
        p = p - lr * d
    return p, buf


def ref_adam(p, grads, lr, b1, b2, eps, wd, decoupled):
    """torch.optim.Adam / AdamW single-tensor path (lerp form of m), in float64."""
    p = p.astype(np.float64)
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    for t, g in enumerate(grads, start=1):
        g = g.astype(np.float64)
        if decoupled:
            p = p * (1 - lr * wd)
        elif wd:
            g = g + wd * p
        m = m + (1 - b1) * (g - m)
        v = v * b2 + (1 - b2) * g * g
        step_size = lr / (1 - b1**t)
        denom = np.sqrt(v) / np.sqrt(1 - b2**t) + eps
        p = p - step_size * m / denom
    return p, m, v


SGD_CASES = [
    dict(momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False),
    dict(momentum=0.0, dampening=0.0, weight_decay=0.1, nesterov=False),
    dict(momentum=0.9, dampening=0.0, weight_decay=0.0, nesterov=False),
    dict(momentum=0.9, dampening=0.3, weight_decay=0.01, nesterov=False),
    dict(momentum=0.8, dampening=0.0, weight_decay=0.05, nesterov=True),
]


@pytest.mark.parametrize(
    "case", SGD_CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items())
)
@pytest.mark.parametrize("n", [1, 7, 64])
def test_sgd(be, rng, n, case):
    p0 = rand(rng, n)
    grads = [rand(rng, n) for _ in range(STEPS)]
    p = put(be, p0)
    buf = put(be, np.full(n, 123.0, np.float32)) if case["momentum"] else None  # ignored on step 1
    for t, g in enumerate(grads, start=1):
        be.sgd_step(p, put(be, g), buf, SgdHyperparameters(0.1, **case), step=t)
    ref_p, ref_buf = ref_sgd(p0, grads, 0.1, **case)
    np.testing.assert_allclose(get(be, p), ref_p, rtol=1e-5, atol=1e-6)
    if buf is not None:
        np.testing.assert_allclose(get(be, buf), ref_buf, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("decoupled,wd", [(False, 0.0), (False, 0.1), (True, 0.01), (True, 0.2)])
@pytest.mark.parametrize("n", [1, 5, 64])
def test_adam_and_adamw(be, rng, n, decoupled, wd):
    p0 = rand(rng, n)
    grads = [rand(rng, n) for _ in range(STEPS)]
    p, m, v = put(be, p0), be.zeros(n), be.zeros(n)
    for t, g in enumerate(grads, start=1):
        gb = put(be, g)
        hyper = AdamHyperparameters(0.01, 0.9, 0.99, 1e-8, weight_decay=wd, decoupled=decoupled)
        be.adam_step(p, gb, m, v, hyper, step=t)
        np.testing.assert_array_equal(get(be, gb), g)  # gradients are read only
    ref_p, ref_m, ref_v = ref_adam(p0, grads, 0.01, 0.9, 0.99, 1e-8, wd, decoupled)
    np.testing.assert_allclose(get(be, p), ref_p, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(get(be, m), ref_m, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(get(be, v), ref_v, rtol=1e-5, atol=1e-7)


def test_adam_first_step_moves_each_parameter_by_about_lr():
    """Adam's known first-step property: |dp| = lr * |g| / (|g| + eps') ~ lr."""
    be = backend_for("cpu:0")
    p = np.zeros(4, np.float32)
    be.adam_step(
        p,
        np.array([1.0, -2.0, 0.5, 3.0], np.float32),
        np.zeros(4, np.float32),
        np.zeros(4, np.float32),
        AdamHyperparameters(lr=0.1),
        step=1,
    )
    np.testing.assert_allclose(p, [-0.1, 0.1, -0.1, -0.1], rtol=1e-6)


@settings(max_examples=15, deadline=None)
@given(
    n=st.integers(1, 3000),
    momentum=st.sampled_from([0.0, 0.5, 0.9]),
    nesterov=st.booleans(),
    wd=st.sampled_from([0.0, 1e-3, 0.1]),
    decoupled=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_cpu_optimizers_random(n, momentum, nesterov, wd, decoupled, seed):
    be = backend_for("cpu:0")
    rng = np.random.default_rng(seed)
    p0 = rand(rng, n, dtype=np.float64)
    grads = [rand(rng, n, dtype=np.float64) for _ in range(3)]
    nesterov = nesterov and momentum > 0
    p, buf = p0.copy(), np.zeros(n)
    for t, g in enumerate(grads, start=1):
        hyper = SgdHyperparameters(0.05, momentum=momentum, weight_decay=wd, nesterov=nesterov)
        be.sgd_step(p, g, buf, hyper, step=t)
    np.testing.assert_allclose(
        p, ref_sgd(p0, grads, 0.05, momentum, 0.0, wd, nesterov)[0], rtol=1e-10, atol=1e-12
    )
    p, m, v = p0.copy(), np.zeros(n), np.zeros(n)
    for t, g in enumerate(grads, start=1):
        hyper = AdamHyperparameters(0.01, weight_decay=wd, decoupled=decoupled)
        be.adam_step(p, g, m, v, hyper, step=t)
    np.testing.assert_allclose(
        p, ref_adam(p0, grads, 0.01, 0.9, 0.999, 1e-8, wd, decoupled)[0], rtol=1e-9, atol=1e-12
    )


def test_the_checked_steps_refuse_hyperparameters_infinite_in_the_buffers_dtype(be):
    """lr=1e39 is a valid float64 hyperparameter; on float32 buffers the
    checked entries refuse it (naming the op, value and dtype), nothing written."""
    p, g = put(be, np.ones(3, np.float32)), put(be, np.ones(3, np.float32))
    m, v = be.zeros(3), be.zeros(3)
    with pytest.raises(ValueError, match=r"sgd_step: lr must be finite in float32, got 1e\+39"):
        be.sgd_step(p, g, None, SgdHyperparameters(1e39), step=1)
    hyper = AdamHyperparameters(1.0, eps=1e39)
    with pytest.raises(ValueError, match=r"adam_step: eps must be finite in float32, got 1e\+39"):
        be.adam_step(p, g, m, v, hyper, step=1)
    np.testing.assert_array_equal(get(be, p), np.ones(3, np.float32))
    np.testing.assert_array_equal(get(be, m), np.zeros(3, np.float32))


def test_the_checked_steps_take_float64_hyperparameters_on_float64_buffers():
    be = backend_for("cpu:0")
    p = np.ones(3)
    be.sgd_step(p, np.ones(3), None, SgdHyperparameters(1e39), step=1)
    assert np.all(p == 1.0 - 1e39)
