"""Out-of-place optimizer steps (`params_out`, ...): bit-identical to in place, inputs untouched."""

from __future__ import annotations

import numpy as np
import pytest
from accel_helpers import get, put, rand

from atomr.accel import AdamHyperparameters, SgdHyperparameters

N = 37  # tiny: the CUDA case may run under the simulator


@pytest.mark.parametrize(
    "case",
    [
        dict(momentum=0.0, dampening=0.0, weight_decay=0.1, nesterov=False),
        dict(momentum=0.9, dampening=0.3, weight_decay=0.01, nesterov=False),
        dict(momentum=0.8, dampening=0.0, weight_decay=0.05, nesterov=True),
    ],
    ids=["plain", "momentum", "nesterov"],
)
def test_sgd_out_of_place_matches_in_place(be, case) -> None:
    rng = np.random.default_rng(1)
    p0, b0 = rand(rng, N), rand(rng, N)
    has_buf = case["momentum"] != 0.0
    p_in, b_in = put(be, p0), put(be, b0)
    p_a, b_a = put(be, p0), put(be, b0)
    p_o, b_o = put(be, np.zeros(N, np.float32)), put(be, np.zeros(N, np.float32))
    hyper = SgdHyperparameters(0.1, **case)
    for step in (1, 2, 3):
        g = put(be, rand(rng, N))
        be.sgd_step(p_in, g, b_in if has_buf else None, hyper, step)
        before = get(be, p_a), get(be, b_a)
        be.sgd_step(
            p_a,
            g,
            b_a if has_buf else None,
            hyper,
            step,
            params_out=p_o,
            momentum_out=b_o if has_buf else None,
        )
        np.testing.assert_array_equal(get(be, p_a), before[0])  # inputs untouched
        np.testing.assert_array_equal(get(be, b_a), before[1])
        np.testing.assert_array_equal(get(be, p_o), get(be, p_in))  # bit-identical
        if has_buf:
            np.testing.assert_array_equal(get(be, b_o), get(be, b_in))
        p_a, p_o = p_o, p_a
        b_a, b_o = b_o, b_a


@pytest.mark.parametrize("decoupled", [False, True], ids=["adam", "adamw"])
def test_adam_out_of_place_matches_in_place(be, decoupled) -> None:
    rng = np.random.default_rng(2)
    p0 = rand(rng, N)
    zeros = np.zeros(N, np.float32)
    ins = [put(be, p0), put(be, zeros), put(be, zeros)]
    cur = [put(be, p0), put(be, zeros), put(be, zeros)]
    spare = [put(be, zeros), put(be, zeros), put(be, zeros)]
    hyper = AdamHyperparameters(0.01, weight_decay=0.05, decoupled=decoupled)
    for step in (1, 2, 3):
        g = put(be, rand(rng, N))
        be.adam_step(ins[0], g, ins[1], ins[2], hyper, step)
        before = [get(be, b) for b in cur]
        be.adam_step(
            cur[0],
            g,
            cur[1],
            cur[2],
            hyper,
            step,
            params_out=spare[0],
            exp_avg_out=spare[1],
            exp_avg_sq_out=spare[2],
        )
        for b, host in zip(cur, before, strict=True):
            np.testing.assert_array_equal(get(be, b), host)
        for out, ref in zip(spare, ins, strict=True):
            np.testing.assert_array_equal(get(be, out), get(be, ref))
        cur, spare = spare, cur


def test_out_buffers_are_checked(be) -> None:
    p, g, m, v = (put(be, np.zeros(N, np.float32)) for _ in range(4))
    short = put(be, np.zeros(N - 1, np.float32))
    with pytest.raises(ValueError):
        be.adam_step(p, g, m, v, AdamHyperparameters(0.1), 1, params_out=short)
    with pytest.raises(ValueError):
        be.sgd_step(p, g, None, SgdHyperparameters(0.1), 1, momentum_out=m)
