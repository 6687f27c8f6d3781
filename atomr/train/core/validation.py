"""Batch validation shared by every trainer: reject bad input before any math.

Values are checked as the model will use them: after the cast to its dtype
(float64 features of 1e300 are infinite in float32), and masked arrays are
refused (their mask would be silently dropped).
"""

from __future__ import annotations

import operator
from typing import Any, Protocol

import numpy as np

from atomr.train.core.errors import InvalidBatchError

__all__ = [
    "BatchSpec",
    "cast_finite",
    "check_token_ids",
    "is_float32_or_64",
    "refuse_masked",
    "validate_batch",
    "validate_features",
    "validate_tokens",
]


def is_float32_or_64(dtype: np.dtype) -> bool:
    """float32 or float64, in either byte order (`cast_finite` makes it native)."""
    return dtype.kind == "f" and dtype.itemsize in (4, 8)


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


def check_token_ids(ids: np.ndarray, vocab: int, what: str = "token ids") -> None:
    """Check that `ids` index a table of `vocab` rows.

    Raises:
        TypeError: `ids` are not of an integer dtype.
        ValueError: an id outside `[0, vocab)` (the message names both ends).
    """
    if ids.dtype.kind not in "iu":
        raise TypeError(f"{what} must be integers, got {ids.dtype}")
    if ids.size:
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or high >= vocab:
            raise ValueError(f"{what} must be in [0, {vocab}), got {low} .. {high}")


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


def validate_features(
    features: Any, in_shape: int | tuple[int, ...], dtype: Any = np.float32
) -> np.ndarray:
    """Check a feature array and return it as a contiguous array of `dtype`.

    Args:
        features: array `(batch, *in_shape)` of float32 or float64, batch >= 1.
        in_shape: the model's per-sample input shape (an int: its width).
        dtype: the model's float dtype (features are cast to it).

    Returns:
        The features, C-contiguous, of `dtype` (the input itself when it
        already is).

    Raises:
        InvalidBatchError: not an ndarray, a masked array, of another rank,
            empty, of another per-sample shape, not a float dtype, or holds
            NaN / Inf (in `dtype`).
        TypeError: `in_shape` is neither an integer nor a sequence of them.
    """
    if isinstance(in_shape, tuple | list):
        shape = tuple(operator.index(d) for d in in_shape)
    else:  # a width: an int of any integer type
        shape = (operator.index(in_shape),)
    if not isinstance(features, np.ndarray):
        raise InvalidBatchError(f"features must be a numpy array, got {type(features).__name__}")
    refuse_masked(features, "features")
    if not is_float32_or_64(features.dtype):
        raise InvalidBatchError(f"features must be float32 or float64, got {features.dtype}")
    if features.ndim != 1 + len(shape) or features.shape[0] < 1:
        raise InvalidBatchError(
            f"features must be {1 + len(shape)}-D (batch >= 1, *{shape}), "
            f"got shape {features.shape}"
        )
    if features.shape[1:] != shape:
        if len(shape) == 1:
            raise InvalidBatchError(
                f"features have width {features.shape[1]}, the model expects {shape[0]}"
            )
        raise InvalidBatchError(
            f"features have per-sample shape {features.shape[1:]}, the model expects {shape}"
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


def validate_tokens(
    features: Any, labels: Any, t_len: int, vocab: int, loss: TargetValidator, classes: int
) -> tuple[np.ndarray, np.ndarray]:
    """Check a batch of token sequences and their next-token labels.

    Args:
        features: int ids `(batch, t_len)` in `[0, vocab)`, batch >= 1.
        labels: int labels `(batch, t_len)` in `[0, classes)` (cross-entropy).
        t_len: the model's sequence length.
        vocab: the number of token ids.
        loss: the loss kind; must be a classification loss.
        classes: the model's output width.

    Returns:
        `(ids, labels)`, contiguous int64.

    Raises:
        InvalidBatchError: any check fails; nothing has been computed.
    """
    if not isinstance(features, np.ndarray):
        raise InvalidBatchError(f"token ids must be a numpy array, got {type(features).__name__}")
    refuse_masked(features, "token ids")
    if features.ndim != 2 or features.shape[0] < 1 or features.shape[1] != t_len:
        raise InvalidBatchError(
            f"token ids must have shape (batch >= 1, {t_len}), got {features.shape}"
        )
    try:
        check_token_ids(features, vocab)
    except (TypeError, ValueError) as exc:
        raise InvalidBatchError(str(exc)) from None
    if not getattr(loss, "is_classification", False):
        raise InvalidBatchError("a token model is trained with cross-entropy over the next tokens")
    if not isinstance(labels, np.ndarray) or labels.shape != features.shape:
        shape = getattr(labels, "shape", type(labels).__name__)
        raise InvalidBatchError(f"labels must be an array of shape {features.shape}, got {shape}")
    flat = loss.validate_targets(labels.reshape(-1), labels.size, classes)
    return np.ascontiguousarray(features, dtype=np.int64), flat.reshape(labels.shape)


class BatchSpec:
    """What a model takes and gives, from its config: the one place a trainer
    checks a batch against its model (any model: an `Mlp`, any `Sequential`).

    Args:
        in_shape, out_shape: per-sample shapes.
        input_kind: "float" or "tokens".
        vocab: the token ids' range (tokens only).
        dtype: the model's float dtype.
    """

    def __init__(
        self,
        in_shape: tuple[int, ...],
        out_shape: tuple[int, ...],
        input_kind: str,
        vocab: int | None,
        dtype: Any,
    ) -> None:
        self.in_shape, self.out_shape = in_shape, out_shape
        self.input_kind, self.vocab, self.dtype = input_kind, vocab, np.dtype(dtype)

    def validate(
        self, features: Any, labels: Any, loss: TargetValidator
    ) -> tuple[np.ndarray, np.ndarray]:
        """The batch, checked and cast (`validate_batch` or `validate_tokens`).

        Raises:
            InvalidBatchError: any check fails; nothing has been computed.
        """
        if self.input_kind == "tokens":
            assert self.vocab is not None
            return validate_tokens(
                features, labels, self.in_shape[0], self.vocab, loss, self.out_shape[-1]
            )
        if len(self.in_shape) == 1 and len(self.out_shape) == 1:
            return validate_batch(
                features,
                labels,
                self.in_shape[-1],
                loss,
                out_width=self.out_shape[-1],
                dtype=self.dtype,
            )
        return self._validate_shaped(features, labels, loss)

    def _validate_shaped(
        self, features: Any, labels: Any, loss: TargetValidator
    ) -> tuple[np.ndarray, np.ndarray]:
        """A float batch for per-sample shapes of several axes: features
        `(batch, *in_shape)`; targets per output row (`out_shape[:-1]` of
        them per sample): class labels `(batch, *out_shape[:-1])`, or
        regression targets `(batch, *out_shape)`.

        Raises:
            InvalidBatchError: any check fails.
        """
        x = validate_features(features, self.in_shape, self.dtype)
        width = self.out_shape[-1]
        rows = (x.shape[0], *self.out_shape[:-1])
        classes = getattr(loss, "is_classification", False)
        want = rows if classes else (*rows, width)
        if not isinstance(labels, np.ndarray) or labels.shape != want:
            shape = getattr(labels, "shape", type(labels).__name__)
            raise InvalidBatchError(f"targets must be an array of shape {want}, got {shape}")
        n_rows = int(np.prod(rows))
        flat = labels.reshape(n_rows) if classes else labels.reshape(n_rows, width)
        y = loss.validate_targets(flat, n_rows, width, self.dtype)
        return x, y.reshape(want)
