"""The optimizer steps report, from their own pass, whether every new weight is finite."""

from __future__ import annotations

import numpy as np
import pytest
from accel_helpers import put

from atomr.accel import AdamHyperparameters, SgdHyperparameters

N = 37  # tiny: the CUDA case may run under the simulator


@pytest.mark.parametrize("momentum", [0.0, 0.9], ids=["plain", "momentum"])
@pytest.mark.parametrize("out_of_place", [False, True], ids=["in_place", "out_of_place"])
def test_sgd_reports_a_non_finite_weight(be, momentum, out_of_place) -> None:
    p = np.full(N, 1.0, np.float32)
    g = np.full(N, 1e-3, np.float32)
    hyper = SgdHyperparameters(1e20, momentum=momentum)
    buf = put(be, np.zeros(N, np.float32)) if momentum else None
    outs = {"params_out": put(be, np.zeros(N, np.float32))} if out_of_place else {}
    if momentum and out_of_place:
        outs["momentum_out"] = put(be, np.zeros(N, np.float32))
    assert be.sgd_step(put(be, p), put(be, g), buf, hyper, 1, **outs) is True
    g[N - 1] = 1e30  # lr * g = 1e50: infinite in float32, one element only
    assert be.sgd_step(put(be, p), put(be, g), buf, hyper, 1, **outs) is False


@pytest.mark.parametrize("decoupled", [False, True], ids=["adam", "adamw"])
@pytest.mark.parametrize("out_of_place", [False, True], ids=["in_place", "out_of_place"])
def test_adam_reports_a_non_finite_weight(be, decoupled, out_of_place) -> None:
    zeros = np.zeros(N, np.float32)
    hyper = AdamHyperparameters(3e37, 0.9, 0.999, 1e-8, 0.0, decoupled=decoupled)
    g = np.full(N, 1.0, np.float32)

    def step(p: np.ndarray) -> bool:
        outs = {}
        if out_of_place:
            outs = {f"{k}_out": put(be, zeros) for k in ("params", "exp_avg", "exp_avg_sq")}
        return be.adam_step(
            put(be, p), put(be, g), put(be, zeros), put(be, zeros), hyper, 1, **outs
        )

    assert (
        step(np.full(N, 1.0, np.float32)) is True
    )  # 1 - 3e37 (the first step moves by lr / (1 - beta1) * 0.1)
    p = np.full(N, 1.0, np.float32)
    p[0] = -3.3e38  # -3.3e38 - 3e37 overflows
    assert step(p) is False


def test_nan_weight_is_reported(be) -> None:
    p = np.ones(N, np.float32)
    p[3] = np.nan
    hyper = SgdHyperparameters(0.1)
    assert be.sgd_step(put(be, p), put(be, np.ones(N, np.float32)), None, hyper, 1) is False
