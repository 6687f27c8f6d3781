"""Batch validation shared by every trainer: reject bad input before any math.

Values are checked as the model will use them: after the cast to its dtype
(float64 features of 1e300 are infinite in float32), and masked arrays are
refused (their mask would be silently dropped).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from atomr.train.core.errors import InvalidBatchError

__all__ = ["cast_finite", "refuse_masked", "validate_batch", "validate_features"]

_FLOATS = (np.float32, np.float64)


class TargetValidator(Protocol):
    """What `validate_batch` needs of a loss (`LossKind`)."""

    def validate_targets(
        self, labels: Any, batch: int, out_width: int, dtype: Any = np.float32
    ) -> np.ndarray: ...


def refuse_masked(array: np.ndarray, what: str) -> None:
    """Refuse a masked array (NumPy would drop its mask, using the hidden values).

    Raises:
        InvalidBatchError: `array` is a `numpy.ma.MaskedArray`.
    """
    if isinstance(array, np.ma.MaskedArray):
        raise InvalidBatchError(f"{what} must be a plain numpy array, not a masked array")


def cast_finite(array: np.ndarray, dtype: Any, what: str) -> np.ndarray:
    """`array` as a C-contiguous array of `dtype`, checked finite after the cast.

    Args:
        array: a float array.
        dtype: the dtype the model computes in.
        what: the name for the message ("features", "targets").

    Returns:
        The cast array (`array` itself when it already is one).

    Raises:
        InvalidBatchError: NaN or Inf, before or after the cast (the message
            says which: a finite value too large for `dtype` is named so).
    """
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is refused below
        out = np.ascontiguousarray(array, dtype=dtype)
    if not np.isfinite(out).all():
        if np.isfinite(array).all():
            raise InvalidBatchError(
                f"{what} hold values too large for {np.dtype(dtype)} (NaN or Inf after the cast)"
            )
        raise InvalidBatchError(f"{what} contain NaN or Inf")
    return out


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
        InvalidBatchError: not an ndarray, a masked array, not 2-D, empty,
            wrong width, not a float dtype, or holds NaN / Inf (in `dtype`).
    """
    if not isinstance(features, np.ndarray):
        raise InvalidBatchError(f"features must be a numpy array, got {type(features).__name__}")
    refuse_masked(features, "features")
    if features.dtype not in _FLOATS:
        raise InvalidBatchError(f"features must be float32 or float64, got {features.dtype}")
    if features.ndim != 2 or features.shape[0] < 1:
        raise InvalidBatchError(f"features must be 2-D with batch >= 1, got shape {features.shape}")
    if features.shape[1] != in_width:
        raise InvalidBatchError(
            f"features have width {features.shape[1]}, the model expects {in_width}"
        )
    return cast_finite(features, dtype, "features")


def validate_batch(
    features: Any,
    labels: Any,
    in_width: int,
    loss: TargetValidator,
    *,
    out_width: int,
    dtype: Any = np.float32,
) -> tuple[np.ndarray, np.ndarray]:
    """Check a training or evaluation batch (features and labels together).

    Args:
        features: see `validate_features`.
        labels: see `LossKind.validate_targets`.
        in_width: the model's input width.
        loss: the loss kind (a `LossKind`).
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
