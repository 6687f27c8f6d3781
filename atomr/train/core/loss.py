"""`LossKind`: mean-squared error and (weighted) softmax cross-entropy.

Each loss is computed as a *sum* plus a *normaliser* (internals.md section 3)
by the fused kernels of the accel layer; the mean is `sum / normaliser`:

| loss | sum | normaliser | d(sum)/d(outputs) |
|---|---|---|---|
| MSE | `sum((y - t)^2)` | `y.size` (torch's mean over elements) | `2 (y - t)` |
| cross-entropy | `sum_i -log softmax(z_i)[t_i]` | batch size | `softmax(z_i) - onehot(t_i)` |
| weighted CE | `sum_i w[t_i] * -log softmax(z_i)[t_i]` | `sum_i w[t_i]` | `w[t_i] (softmax(z_i) - onehot(t_i))` |

Parallel trainers add sums and normalisers across shards and divide once,
which keeps them exact for any split of the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from atomr._arguments import sequence_entries
from atomr.accel._loss_ops import check_class_weights
from atomr.accel.hyperparameters import given_in
from atomr.train.core._cpu import cpu_backend
from atomr.train.core._step_checks import check_normaliser
from atomr.train.core.errors import InvalidBatchError
from atomr.train.core.model.inputs import model_dtype
from atomr.train.core.validation import cast_finite, is_float32_or_64, refuse_masked

__all__ = ["LossKind"]

_NAMES = ("mse", "cross_entropy")


@dataclass(frozen=True)
class LossKind:
    """A loss function: `LossKind.MSE`, `LossKind.CROSS_ENTROPY` or
    `LossKind.weighted_cross_entropy(class_weights)`.

    Attributes:
        name: "mse" or "cross_entropy".
        class_weights: per-class weights of weighted cross-entropy, else None.

    Raises:
        TypeError: class weights that are not a list, tuple or 1-D array of
            real numbers (`weighted_cross_entropy`).
        ValueError: unknown name; class weights for MSE, or weights that are
            empty, negative, not finite in float64, non-zero but 0 in float64
            (`Fraction(1, 10**400)`) or all zero. (Infinite in
            the model's dtype, 1e39 in float32, or rounding to 0 there, 1e-50
            in float32: `check_dtype`.)
    """

    name: str
    class_weights: tuple[float, ...] | None = None

    MSE: ClassVar[LossKind]
    CROSS_ENTROPY: ClassVar[LossKind]

    def __post_init__(self) -> None:
        if self.name not in _NAMES:
            raise ValueError(f"unknown loss {self.name!r}; expected one of {_NAMES}")
        if self.class_weights is None:
            return
        if self.name != "cross_entropy":
            raise ValueError("class_weights only apply to cross-entropy")
        w = _given_weights(self.class_weights)
        check_class_weights("class_weights", w, np.float64)  # the model's dtype: check_dtype
        if not any(v > 0 for v in w):
            raise ValueError("class_weights must be non-empty and not all zero")
        object.__setattr__(self, "class_weights", w)

    @classmethod
    def weighted_cross_entropy(cls, class_weights: Sequence[float] | np.ndarray) -> LossKind:
        """Cross-entropy with a weight per class (torch's `cross_entropy(weight=)`).

        Args:
            class_weights: one non-negative finite weight per class, at least
                one of them positive.

        Returns:
            The loss kind; its mean divides by the sum of the targets' weights.

        Raises:
            TypeError: not a list, tuple or 1-D array of real numbers (a
                bool or a string is none).
            ValueError: empty, negative, non-finite (in float64), non-zero
                but 0 in float64, or all-zero weights (in the model's dtype:
                `check_dtype`).
        """
        return cls("cross_entropy", _given_weights(class_weights))

    def check_dtype(self, dtype: Any) -> None:
        """Check the class weights, if any, in `dtype`, the model's: 1e39 and
        1e-50 are weights a float64 model computes with and a float32 one
        cannot hold (infinite; 0, its class silently dropped). Every trainer
        runs it when it is spawned (`TrainerConfig.check_dtype`), `compute`
        on every call; the kernels take the weights unchecked.

        Raises:
            ValueError: `dtype` is not float32 or float64 (`model_dtype`), a
                weight infinite in `dtype`, naming it and its class, or a
                non-zero one below `dtype`'s smallest normal number (0 or
                subnormal there: `check_class_weights`).
        """
        dt = model_dtype(dtype)
        if self.class_weights is not None:
            check_class_weights("class_weights", self.class_weights, dt)

    @property
    def is_classification(self) -> bool:
        """True for cross-entropy (integer class labels), False for MSE."""
        return self.name == "cross_entropy"

    def normaliser(self, targets: np.ndarray, dtype: Any = np.float32) -> float:
        """The normaliser `sums` gives, from validated host targets alone (the
        table above): every MSE target value, every labelled row or token, or
        the sum of their class weights, each weight rounded to the model's
        `dtype` as `sums` gives it to the kernel (0.2 is 0.20000000298 in
        float32), summed in float64."""
        if self.class_weights is None or not self.is_classification:
            return float(targets.size)
        weights = np.asarray(self.class_weights, dtype=np.dtype(dtype)).astype(np.float64)
        return float(weights[targets].sum())

    def sums(self, backend: Any, outputs: Any, targets: Any, grad: Any) -> tuple[float, float]:
        """Loss sum and normaliser on a device, with the gradient of the sum.

        The buffers go to the backend's unchecked kernels (`Backend`
        docstring): they are the model's output, a buffer made for its
        gradient, and targets that `validate_targets` (a trainer's boundary)
        has passed.

        Args:
            backend: the device's kernels (`atomr.accel.backend_for(device)`).
            outputs: model outputs `(batch, out_width)` in the backend's
                memory, C-contiguous; `(batch, T, out_width)` for a sequence
                model (cross-entropy over every position: labels `(batch, T)`).
            targets: validated int64 labels `(batch,)` (cross-entropy) or
                targets shaped like `outputs` (MSE), in the backend's memory
                (CE labels may also be a host array).
            grad: contiguous buffer shaped like `outputs`; receives
                d(sum)/d(outputs).

        Returns:
            `(loss_sum, normaliser)`; the mean loss is their quotient and its
            gradient is `grad / normaliser`.
        """
        if self.name == "mse":
            flat = outputs.reshape(-1)
            loss_sum = backend.mse_unchecked(flat, targets.reshape(-1), grad.reshape(-1))
            return float(loss_sum), float(flat.shape[0])
        if outputs.ndim > 2:  # a sequence: every position is a row
            outputs = outputs.reshape(-1, outputs.shape[outputs.ndim - 1])
            grad = grad.reshape(outputs.shape)
            targets = targets.reshape(-1)
        weights = None
        if self.class_weights is not None:
            weights = np.asarray(self.class_weights, dtype=np.dtype(outputs.dtype))
        loss_sum, weight_sum = backend.softmax_cross_entropy_unchecked(
            outputs, targets, weights, grad
        )
        return float(loss_sum), float(weight_sum)

    def validate_targets(
        self, labels: Any, batch: int, out_width: int, dtype: Any = np.float32
    ) -> np.ndarray:
        """Check labels (cross-entropy) or regression targets (MSE) for this loss.

        Args:
            labels: for cross-entropy, integer labels `(batch,)` in
                `[0, out_width)`; for MSE, a float array `(batch, out_width)`.
            batch: the batch size the labels must match.
            out_width: the model's output width (number of classes).
            dtype: the model's float dtype (MSE targets are cast to it).

        Returns:
            Contiguous int64 labels, or contiguous `dtype` targets.

        Raises:
            InvalidBatchError: wrong type, dtype, shape, label out of range, a
                weighted-CE class count that differs from `out_width`, or
                NaN/Inf targets.
        """
        if not isinstance(labels, np.ndarray):
            raise InvalidBatchError(f"labels must be a numpy array, got {type(labels).__name__}")
        refuse_masked(labels, "labels")
        if self.is_classification:
            if labels.dtype.kind not in "iu":
                raise InvalidBatchError(
                    f"cross-entropy labels must be integers, got {labels.dtype}"
                    + _target_hint(labels, batch, out_width, classes=True)
                )
            if labels.shape != (batch,):
                raise InvalidBatchError(
                    f"labels must have shape ({batch},), got {labels.shape}"
                    + _target_hint(labels, batch, out_width, classes=True)
                )
            if self.class_weights is not None and len(self.class_weights) != out_width:
                raise InvalidBatchError(
                    f"{len(self.class_weights)} class weights for {out_width} classes"
                )
            out = np.ascontiguousarray(labels, dtype=np.int64)
            # one pass for both ends: read as unsigned, a negative label is
            # 2**63 or more, and a uint64 one past int64 keeps its value
            if batch and int(out.view(np.uint64).max()) >= out_width:
                raise InvalidBatchError(
                    f"labels must be in [0, {out_width}), got range "
                    f"[{int(labels.min())}, {int(labels.max())}]"
                )
            return out
        if not is_float32_or_64(labels.dtype):
            raise InvalidBatchError(
                f"MSE targets must be float32 or float64, got {labels.dtype}"
                + _target_hint(labels, batch, out_width, classes=False)
            )
        if labels.shape != (batch, out_width):
            raise InvalidBatchError(
                f"MSE targets must have shape ({batch}, {out_width}), got {labels.shape}"
                + _target_hint(labels, batch, out_width, classes=False)
            )
        return cast_finite(labels, dtype, "targets", locate=True)

    def compute(self, outputs: np.ndarray, targets: np.ndarray) -> tuple[float, np.ndarray]:
        """Mean loss and its gradient on host arrays (CPU kernels).

        Same values and gradients as torch.nn.functional's `mse_loss` /
        `cross_entropy(weight=...)` with mean reduction.

        Args:
            outputs: float32 or float64 array `(batch, out_width)`.
            targets: int labels `(batch,)` in `[0, out_width)` for
                cross-entropy; an array shaped like `outputs` for MSE.

        Returns:
            `(value, grad)`: the mean loss and d(value)/d(outputs), same dtype
            as `outputs`.

        Raises:
            InvalidBatchError: shapes, dtypes or label range do not fit, or
                every target of a weighted cross-entropy has weight 0.
            ValueError: a class weight infinite in the outputs' dtype
                (`check_dtype`).
        """
        outputs = np.asarray(outputs)
        if outputs.ndim != 2 or not is_float32_or_64(outputs.dtype):
            raise InvalidBatchError(
                f"outputs must be a 2-D float32/float64 array, got {outputs.dtype} {outputs.shape}"
            )
        outputs = np.ascontiguousarray(outputs)
        self.check_dtype(outputs.dtype)
        targets = self.validate_targets(targets, outputs.shape[0], outputs.shape[1], outputs.dtype)
        grad = np.empty_like(outputs)
        loss_sum, norm = self.sums(cpu_backend(), outputs, targets, grad)
        check_normaliser(norm)
        grad *= outputs.dtype.type(1.0 / norm)
        return loss_sum / norm, grad

    def to_config(self) -> dict[str, Any]:
        """A JSON-serialisable description (for checkpoints and the CLI)."""
        return {"name": self.name, "class_weights": self.class_weights}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> LossKind:
        """Rebuild a loss kind from `to_config()`'s output.

        Raises:
            TypeError: weights that are not a list of real numbers.
            ValueError: unknown loss, or bad weights (or weights for MSE).
        """
        return cls(str(config["name"]), config.get("class_weights"))


def _given_weights(weights: Any) -> tuple[float, ...]:
    """Class weights as given: a list, tuple or 1-D array of real numbers
    (`sequence_entries`), each one `given_in` float64 (a bool or a string is
    no number; `Fraction(1, 10**400)`, which `float()` makes 0, and 10**400
    are refused). Floats and float or int arrays are taken whole (exact in
    float64); `check_class_weights` checks them all.

    Raises:
        TypeError: not such a sequence, or an entry that is no real number.
        ValueError: an entry infinite in float64, or non-zero but 0 there.
    """
    if isinstance(weights, np.ndarray) and weights.dtype.kind in "fiu":
        weights = weights.astype(np.float64)
    entries = sequence_entries("class_weights", weights, "real numbers")
    if all(type(v) is float or type(v) is np.float64 for v in entries):
        return tuple(float(v) for v in entries)  # type: ignore[arg-type]
    return tuple(given_in(f"class_weights[{i}]", v, np.float64) for i, v in enumerate(entries))


LossKind.MSE = LossKind("mse")
LossKind.CROSS_ENTROPY = LossKind("cross_entropy")


def _target_hint(labels: np.ndarray, batch: int, out_width: int, *, classes: bool) -> str:
    """What to write instead, when refused targets are shaped for the other
    loss (one-hot rows for cross-entropy, class labels for MSE) or one
    output's targets lack their column ("" otherwise)."""
    if classes and labels.shape == (batch, out_width):
        return (
            " (these look like one-hot rows: cross-entropy takes one class index per "
            "sample, labels.argmax(axis=1); LossKind.MSE takes one-hot targets)"
        )
    if classes or labels.shape != (batch,):
        return ""
    if out_width == 1:
        return f" (one output: reshape them to ({batch}, 1))"
    if labels.dtype.kind in "iub":
        return (
            " (these look like class labels: LossKind.CROSS_ENTROPY takes them; MSE "
            f"takes targets of shape ({batch}, {out_width}), one-hot rows say)"
        )
    return ""
