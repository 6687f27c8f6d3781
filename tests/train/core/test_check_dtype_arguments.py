"""Every `check_dtype` refuses a dtype no model computes in (None, float16,
an integer dtype, a typo, an object) with `model_dtype`'s ValueError: the
loss and LayerNorm took some of them silently or raised NumPy's TypeError."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from atomr.train import LossKind, OptimizerKind, TrainerConfig
from atomr.train.core.model.inputs import model_dtype
from atomr.train.core.model.transformer import LayerNorm

BAD = [None, "float16", np.float16, np.int32, "flaot32", object(), 3]
IDS = ["None", "float16-str", "float16", "int32", "typo", "object", "int"]

CHECKS: dict[str, Any] = {
    "optimizer": OptimizerKind.adam(lr=1e-3).check_dtype,
    "mse": LossKind.MSE.check_dtype,
    "cross_entropy": LossKind.CROSS_ENTROPY.check_dtype,
    "weighted": LossKind.weighted_cross_entropy([1.0, 2.0]).check_dtype,
    "config": TrainerConfig(OptimizerKind.sgd(lr=0.1), LossKind.MSE).check_dtype,
    "layer_norm": LayerNorm(4).check_dtype,
}


@pytest.mark.parametrize("check", sorted(CHECKS))
@pytest.mark.parametrize("dtype", BAD, ids=IDS)
def test_check_dtype_refuses_a_dtype_no_model_computes_in(check: str, dtype: Any) -> None:
    with pytest.raises(ValueError, match="dtype must be float32 or float64, got"):
        CHECKS[check](dtype)


@pytest.mark.parametrize("check", sorted(CHECKS))
@pytest.mark.parametrize("dtype", ["float32", np.float64, np.dtype(np.float32)])
def test_check_dtype_takes_float32_and_float64(check: str, dtype: Any) -> None:
    CHECKS[check](dtype)


def test_model_dtype_refuses_none_which_numpy_reads_as_float64() -> None:
    assert np.dtype(None) == np.float64
    with pytest.raises(ValueError, match="got None"):
        model_dtype(None)
