"""Batch validation shared by every trainer: reject bad input before any math."""

from __future__ import annotations

from typing import Any

import numpy as np

from atomr.train.core.errors import InvalidBatchError
from atomr.train.core.loss import LossKind

__all__ = ["validate_batch", "validate_features"]

_FLOATS = (np.float32, np.float64)


def validate_features(features: Any, in_width: int, dtype: Any = np.float32) -> np.ndarray:
    """Check a feature matrix and return it as a contiguous array of `dtype`.

    Args:
        features: array `(batch, in_width)` of float32 or float64, batch >= 1.
        in_width: the model's input width.
        dtype: the model's float dtype (features are cast to it).

    Returns:
        The features, C-contiguous, of `dtype` (the input itself when it
        already is).

    Raises:
        InvalidBatchError: not an ndarray, not 2-D, empty, wrong width, not a
            float dtype, or holds NaN / Inf.
    """
    if not isinstance(features, np.ndarray):
        raise InvalidBatchError(f"features must be a numpy array, got {type(features).__name__}")
    if features.dtype not in _FLOATS:
        raise InvalidBatchError(f"features must be float32 or float64, got {features.dtype}")
    if features.ndim != 2 or features.shape[0] < 1:
        raise InvalidBatchError(f"features must be 2-D with batch >= 1, got shape {features.shape}")
    if features.shape[1] != in_width:
        raise InvalidBatchError(
            f"features have width {features.shape[1]}, the model expects {in_width}"
        )
    if not np.isfinite(features).all():
        raise InvalidBatchError("features contain NaN or Inf")
    return np.ascontiguousarray(features, dtype=dtype)


def validate_batch(
    features: Any,
    labels: Any,
    in_width: int,
    loss: LossKind,
    *,
    out_width: int,
    dtype: Any = np.float32,
) -> tuple[np.ndarray, np.ndarray]:
    """Check a training or evaluation batch (features and labels together).

    Args:
        features: see `validate_features`.
        labels: see `LossKind.validate_targets`.
        in_width: the model's input width.
        loss: the loss kind.
        out_width: the model's output width (number of classes).
        dtype: the model's float dtype.

    Returns:
        `(features, labels)`, contiguous and of the model's dtypes.

    Raises:
        InvalidBatchError: any check fails; nothing has been computed.
    """
    x = validate_features(features, in_width, dtype)
    y = loss.validate_targets(labels, x.shape[0], out_width, dtype)
    return x, y
