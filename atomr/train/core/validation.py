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
    "check_input_batch",
    "check_token_ids",
    "detached",
    "is_float32_or_64",
    "refuse_masked",
    "validate_batch",
    "validate_features",
    "validate_targets",
    "validate_token_ids",
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


def cast_finite(
    array: np.ndarray,
    dtype: Any,
    what: str,
    error: type[Exception] = InvalidBatchError,
    *,
    locate: bool = False,
) -> np.ndarray:
    """`array` as a C-contiguous array of `dtype`, checked finite after the cast.

    The one home of "finite in the dtype it is used in": a batch, an
    optimizer buffer being loaded (`Optimizer.load_state_dict`: a float64
    buffer of 1e39 is finite for a float64 optimizer, not for a float32 one),
    a checkpoint's pending gradients (`read_pending`), and every parameter,
    weight or gradient vector given (`model.inputs.real_vector`).

    Args:
        array: a float array.
        dtype: the dtype the model computes in.
        what: the name for the message, plural ("features", "targets").
        error: the exception raised (a ValueError, or `CheckpointError`
            for a file's arrays).
        locate: name the first entry that is not finite in the message
            (`features[3, 7]`: a batch, where the user looks for the sample).

    Returns:
        The cast array (`array` itself when it already is one).

    Raises:
        InvalidBatchError: (or `error`) NaN or Inf, before or after the cast
            (the message says which: a finite value too large for `dtype` is
            named so).
    """
    if getattr(array, "dtype", None) == dtype:  # no cast: nothing can overflow
        out = np.ascontiguousarray(array)
    else:
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is refused below
            out = np.ascontiguousarray(array, dtype=dtype)
    if not np.isfinite(out).all():
        where = ""
        if locate:
            index = ", ".join(map(str, np.argwhere(~np.isfinite(out))[0]))
            where = f"the first at {what}[{index}]"
        if np.isfinite(array).all():
            detail = f"; {where}" if where else ""
            raise error(
                f"{what} hold values too large for {np.dtype(dtype)} "
                f"(NaN or Inf after the cast{detail})"
            )
        raise error(f"{what} contain NaN or Inf" + (f" ({where})" if where else ""))
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
        shape = tuple(map(operator.index, in_shape))
    else:  # a width: an int of any integer type
        shape = (operator.index(in_shape),)
    if not isinstance(features, np.ndarray):
        raise InvalidBatchError(f"features must be a numpy array, got {type(features).__name__}")
    refuse_masked(features, "features")
    if not is_float32_or_64(features.dtype):
        raise InvalidBatchError(f"features must be float32 or float64, got {features.dtype}")
    if features.ndim != 1 + len(shape) or features.shape[0] < 1:
        if features.ndim == 1 + len(shape):  # the right rank, no sample
            raise InvalidBatchError(
                f"features hold no sample (shape {features.shape}): a batch needs batch >= 1"
            )
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
    return cast_finite(features, dtype, "features", locate=True)


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
    y = validate_targets(labels, x.shape[0], (out_width,), loss, dtype)
    return x, y


def detached(validated: np.ndarray, given: Any) -> np.ndarray:
    """`validated`, what validation made of the caller's `given`, in memory
    the caller cannot change: itself when validation already made a new
    array (a cast, a contiguous copy), else a copy; so a batch a trainer
    keeps past its answer is copied once, never twice.

    Args:
        validated: the validated array (or a view of it, e.g. a share).
        given: what the caller sent (an array, or what validation took).

    Returns:
        An array that shares no memory with `given`.
    """
    if validated is given or np.may_share_memory(validated, given):  # `is`: no bounds to compare
        return np.array(validated, copy=True)
    return validated


def validate_token_ids(features: Any, t_len: int, vocab: int) -> np.ndarray:
    """Check a batch of token sequences.

    Args:
        features: int ids `(batch, t_len)` in `[0, vocab)`, batch >= 1.
        t_len: the model's sequence length.
        vocab: the number of token ids.

    Returns:
        The ids, contiguous int64.

    Raises:
        InvalidBatchError: not an ndarray, a masked array, not integers, of
            another shape, or an id out of range.
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
    return np.ascontiguousarray(features, dtype=np.int64)


def validate_targets(
    labels: Any, batch: int, out_shape: tuple[int, ...], loss: TargetValidator, dtype: Any
) -> np.ndarray:
    """Check the targets of a batch against the model's output: one per
    output row. An output of per-sample shape `(*rows, width)` takes class
    labels `(batch, *rows)`, or regression targets `(batch, *rows, width)`;
    so `(batch,)` labels for `(classes,)` and `(batch, T)` for `(T, classes)`.

    Args:
        labels: the labels or targets.
        batch: the number of samples.
        out_shape: the model's per-sample output shape.
        loss: the loss kind (a `LossKind`).
        dtype: the model's float dtype (regression targets are cast to it).

    Returns:
        The labels (int64) or targets (`dtype`), contiguous, of that shape.

    Raises:
        InvalidBatchError: another shape (the message names the expected
            one), or what `LossKind.validate_targets` refuses.
    """
    width = out_shape[-1]
    if len(out_shape) == 1:
        return loss.validate_targets(labels, batch, width, dtype)
    rows = (batch, *out_shape[:-1])
    classes = getattr(loss, "is_classification", False)
    want = rows if classes else (*rows, width)
    if not isinstance(labels, np.ndarray) or labels.shape != want:
        shape = getattr(labels, "shape", type(labels).__name__)
        what = "labels" if classes else "targets"
        raise InvalidBatchError(f"{what} must be an array of shape {want}, got {shape}")
    n_rows = int(np.prod(rows))
    flat = labels.reshape(n_rows) if classes else labels.reshape(n_rows, width)
    return loss.validate_targets(flat, n_rows, width, dtype).reshape(want)


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
        """The batch, checked and cast: features `(batch, *in_shape)` (float,
        or token ids) and targets per output row (`validate_targets`): a
        token model's labels follow its output, `(batch, T)` for next-token
        logits `(T, vocab)`, `(batch,)` for a sequence's classes.

        Raises:
            InvalidBatchError: any check fails; nothing has been computed.
        """
        if self.input_kind == "tokens":
            assert self.vocab is not None
            x = validate_token_ids(features, self.in_shape[0], self.vocab)
            if not getattr(loss, "is_classification", False):
                raise InvalidBatchError("a token model is trained with cross-entropy")
        else:
            x = validate_features(features, self.in_shape, self.dtype)
        return x, validate_targets(labels, x.shape[0], self.out_shape, loss, self.dtype)


def check_input_batch(x: Any, in_shape: tuple[int, ...], input_kind: str) -> None:
    """Check a batch given to a model's forward pass (`Sequential.forward`),
    already on the device: `(batch, *in_shape)` (a layer given another shape
    would fail later with a message about itself), and float32 or float64
    for a float model, as a `Step` takes (`is_float32_or_64`; bools, ints or
    float16 would be cast without a word; token ids are the first layer's to
    check). A trainer's `BatchSpec.validate` checks more.

    Raises:
        ValueError: `x` is not `(batch, *in_shape)`.
        TypeError: `input_kind` is "float" and `x` holds no float32 or float64.
    """
    shape = getattr(x, "shape", None)
    if shape is None or len(shape) < 1 or tuple(shape[1:]) != in_shape:
        shown = tuple(shape) if shape is not None else type(x).__name__
        wanted = ", ".join(["batch", *map(str, in_shape)])
        raise ValueError(f"the model takes inputs of shape ({wanted}), got {shown}")
    dtype = getattr(x, "dtype", None)
    if input_kind == "float" and not (dtype is not None and is_float32_or_64(np.dtype(dtype))):
        raise TypeError(f"the model takes float32 or float64 features, got {dtype}")
