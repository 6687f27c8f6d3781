"""Helpers of the accel tests (imported as ``accel_helpers``; pytest puts this folder on sys.path)."""

from __future__ import annotations

from typing import Any

import numpy as np

from atomr.accel import Backend


def rand(rng: np.random.Generator, *shape: int, dtype: Any = np.float32) -> np.ndarray:
    """Standard-normal array of ``shape``."""
    return rng.standard_normal(shape).astype(dtype)


def put(be: Backend, a: np.ndarray) -> Any:
    """Host array -> buffer of ``be``."""
    return be.to_device(a)


def get(be: Backend, buf: Any) -> np.ndarray:
    """Buffer of ``be`` -> host array."""
    return be.to_host(buf)


def tol(dtype: Any) -> dict[str, float]:
    """assert_allclose tolerances for results computed in ``dtype``."""
    if np.dtype(dtype) == np.float64:
        return {"rtol": 1e-10, "atol": 1e-12}
    return {"rtol": 2e-5, "atol": 2e-6}
