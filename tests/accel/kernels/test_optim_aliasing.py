"""Optimizer outputs may be only the input they update in place: a moment or the
weights written over the gradient (``adam_step(p, g, g, v)``), two state buffers
in one memory, or an output over another input is refused, with nothing written.

Each case names the buffers of one call; a repeated name is one buffer passed twice.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from accel_helpers import get, put, rand

from atomr.accel import AdamHyperparameters, Backend, SgdHyperparameters

N = 5  # tiny: the CUDA case may run under the simulator
ADAM = AdamHyperparameters(0.01, weight_decay=0.1)
ADAMW = AdamHyperparameters(0.01, weight_decay=0.1, decoupled=True)
SGD = SgdHyperparameters(0.1, momentum=0.9, weight_decay=0.01)

# (p, g, m, v, params_out, exp_avg_out, exp_avg_sq_out); None: not given
ADAM_REFUSED = {
    "m is g": ("p", "g", "g", "v", None, None, None),
    "v is g": ("p", "g", "m", "g", None, None, None),
    "p is g": ("g", "g", "m", "v", None, None, None),
    "m is v": ("p", "g", "m", "m", None, None, None),
    "p is m": ("p", "g", "p", "v", None, None, None),
    "p is v": ("p", "g", "m", "p", None, None, None),
    "params_out is g": ("p", "g", "m", "v", "g", None, None),
    "exp_avg_out is g": ("p", "g", "m", "v", None, "g", None),
    "exp_avg_sq_out is g": ("p", "g", "m", "v", None, None, "g"),
    "params_out is m": ("p", "g", "m", "v", "m", "M", "V"),
    "exp_avg_out is p": ("p", "g", "m", "v", "P", "p", "V"),
    "exp_avg_sq_out is m": ("p", "g", "m", "v", "P", "M", "m"),
    "exp_avg_out is v": ("p", "g", "m", "v", "P", "v", "V"),
    "params_out is exp_avg_out": ("p", "g", "m", "v", "P", "P", "V"),
    "exp_avg_out is exp_avg_sq_out": ("p", "g", "m", "v", "P", "M", "M"),
    "exp_avg_out is v, updated in place": ("p", "g", "m", "v", None, "v", None),
}

# (p, g, buf, params_out, momentum_out)
SGD_REFUSED = {
    "p is g": ("g", "g", "b", None, None),
    "buf is g": ("p", "g", "g", None, None),
    "p is buf": ("p", "g", "p", None, None),
    "params_out is g": ("p", "g", "b", "g", None),
    "momentum_out is g": ("p", "g", "b", None, "g"),
    "params_out is buf": ("p", "g", "b", "b", "B"),
    "momentum_out is p": ("p", "g", "b", "P", "p"),
    "params_out is momentum_out": ("p", "g", "b", "P", "P"),
    "params_out is buf, updated in place": ("p", "g", "b", "b", None),
}


def _buffers(be: Backend, names: tuple[str | None, ...]) -> dict[str, Any]:
    rng = np.random.default_rng(7)
    return {n: put(be, np.abs(rand(rng, N))) for n in dict.fromkeys(names) if n is not None}


def _assert_untouched(be: Backend, bufs: dict[str, Any], before: dict[str, np.ndarray]) -> None:
    for name, buf in bufs.items():
        np.testing.assert_array_equal(get(be, buf), before[name], err_msg=name)


@pytest.mark.parametrize("hyper", [ADAM, ADAMW], ids=["adam", "adamw"])
@pytest.mark.parametrize("names", list(ADAM_REFUSED.values()), ids=list(ADAM_REFUSED))
def test_adam_refuses_aliased_buffers(be, names, hyper) -> None:
    bufs = _buffers(be, names)
    before = {n: get(be, b) for n, b in bufs.items()}
    p, g, m, v, p_out, m_out, v_out = (None if n is None else bufs[n] for n in names)
    with pytest.raises(ValueError, match="adam_step: .* shares memory with"):
        be.adam_step(
            p, g, m, v, hyper, 1, params_out=p_out, exp_avg_out=m_out, exp_avg_sq_out=v_out
        )
    _assert_untouched(be, bufs, before)


@pytest.mark.parametrize("names", list(SGD_REFUSED.values()), ids=list(SGD_REFUSED))
def test_sgd_refuses_aliased_buffers(be, names) -> None:
    bufs = _buffers(be, names)
    before = {n: get(be, b) for n, b in bufs.items()}
    p, g, buf, p_out, buf_out = (None if n is None else bufs[n] for n in names)
    with pytest.raises(ValueError, match="sgd_step: .* shares memory with"):
        be.sgd_step(p, g, buf, SGD, 2, params_out=p_out, momentum_out=buf_out)
    _assert_untouched(be, bufs, before)


def test_sgd_without_momentum_refuses_params_over_grads(be) -> None:
    g = put(be, np.ones(N, np.float32))
    with pytest.raises(ValueError, match="params shares memory with grads"):
        be.sgd_step(g, g, None, SgdHyperparameters(0.1), 1)
    np.testing.assert_array_equal(get(be, g), np.ones(N, np.float32))


def test_a_partial_overlap_with_grads_is_refused(be) -> None:
    host = np.arange(4 * N, dtype=np.float32)
    whole = put(be, host)
    p, g, v = whole[0:N], whole[N : 2 * N], whole[2 * N : 3 * N]
    with pytest.raises(ValueError, match="exp_avg shares memory with grads"):
        be.adam_step(p, g, whole[N + 1 : 2 * N + 1], v, ADAM, 1)
    np.testing.assert_array_equal(get(be, whole), host)


def test_each_output_may_still_be_its_own_input(be) -> None:
    """In place, and an out-of-place output that is the very input it updates,
    give the step of separate buffers (float64 NumPy reference)."""
    rng = np.random.default_rng(3)
    p0, g0, b0 = rand(rng, N), rand(rng, N), rand(rng, N)
    p, g, m, v = put(be, p0), put(be, g0), put(be, b0), put(be, np.abs(b0))
    be.adam_step(p, g, m, v, ADAM, 1, params_out=p, exp_avg_out=m, exp_avg_sq_out=v)
    pd, gd, md, vd = (x.astype(np.float64) for x in (p0, g0, b0, np.abs(b0)))
    gd = gd + 0.1 * pd
    md, vd = 0.9 * md + 0.1 * gd, 0.999 * vd + 0.001 * gd * gd
    ref = pd - 0.01 / 0.1 * md / (np.sqrt(vd) / np.sqrt(0.001) + 1e-8)
    np.testing.assert_allclose(get(be, p), ref, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(get(be, m), md, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(get(be, v), vd, rtol=2e-5, atol=2e-6)
    np.testing.assert_array_equal(get(be, g), g0)  # the gradient is read only
    q, buf = put(be, p0), put(be, b0)
    be.sgd_step(q, g, buf, SGD, 2, params_out=q, momentum_out=buf)
    bd = 0.9 * b0.astype(np.float64) + (g0 + 0.01 * p0.astype(np.float64))
    np.testing.assert_allclose(get(be, buf), bd, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(get(be, q), p0 - 0.1 * bd, rtol=2e-5, atol=2e-6)
