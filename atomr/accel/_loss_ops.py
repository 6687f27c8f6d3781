"""Backend's fused losses: softmax cross-entropy and mean squared error.

A mixin of ``Backend`` (atomr/accel/backend.py): each checked op validates its
arguments, then calls the ``*_unchecked`` hook a backend implements.
"""

from __future__ import annotations

import abc
from typing import Any

import numpy as np

from atomr.accel._ops_base import OpsBase

__all__ = ["LossOps", "check_class_weights"]


class LossOps(OpsBase, abc.ABC):
    """``Backend``'s fused loss ops (forward and backward in one pass).

    The checked ops validate, then call their ``*_unchecked`` hook (abstract
    here, implemented by each backend); "Unchecked entries" in ``Backend``'s
    docstring says when a caller may call a hook directly.
    """

    # ------------------------------------------------------------ losses

    def softmax_cross_entropy(
        self, logits: Any, labels: Any, weights: Any | None, grad: Any
    ) -> tuple[float, float]:
        """Fused softmax cross-entropy, forward and backward, as sums.

        ``loss_sum = sum_i w[y_i] * (-log softmax(logits_i)[y_i])``,
        ``weight_sum = sum_i w[y_i]`` (w = 1 when ``weights`` is None), and
        ``grad = d(loss_sum)/d(logits)``. Mean reduction (torch's) is
        ``loss_sum / weight_sum``.

        Args:
            logits: 2-D (n, c).
            labels: 1-D (n,) integer class indices in [0, c): a host NumPy array
                (any integer dtype, either byte order), or (CUDA) a device array.
            weights: per-class weights (c,) or None, finite in the logits'
                dtype, non-negative, none rounding to 0; a host array is accepted by both
                backends, a device array must have the logits' dtype.
            grad: written, (n, c); may be ``logits`` itself, must share no
                memory with labels or weights.

        Returns:
            (loss_sum, weight_sum) as Python floats.

        Raises:
            TypeError: wrong array type or dtype, labels not integers.
            ValueError: shape mismatch, not contiguous, a label out of range, a
                weight non-finite, negative or below the smallest normal number, or
                grad sharing memory with labels or weights.
        """
        self.validate("softmax_cross_entropy", logits=logits, grad=grad, read_only=("logits",))
        self._ndim("softmax_cross_entropy", 2, logits=logits)
        self._same_shape("softmax_cross_entropy", ("logits", logits), ("grad", grad))
        n, c = logits.shape
        if c == 0:
            raise ValueError("softmax_cross_entropy: logits need at least one class (c >= 1)")
        self._check_ce_labels(labels, n, c)
        if weights is not None:
            self._check_ce_weights(weights, c, logits.dtype)
        if isinstance(labels, np.ndarray) and not labels.dtype.isnative:
            labels = labels.astype(labels.dtype.newbyteorder("="))  # the kernels' byte order
        # grad is written row by row while labels and weights are read: none
        # of their memory may be grad's (host arrays on CUDA cannot be)
        others = {"labels": labels, "weights": weights}
        read = {k: x for k, x in others.items() if x is not None and self._is_buffer(x)}
        self._check_aliasing("softmax_cross_entropy", tuple(read), {"grad": grad, **read})
        loss, wsum = self.softmax_cross_entropy_unchecked(logits, labels, weights, grad)
        return float(loss), float(wsum)

    def _check_ce_labels(self, labels: Any, n: int, c: int) -> None:
        """Refuse labels that are not n integers in [0, c). Labels in the
        backend's memory are copied to the host for the range check, so that
        a refused call writes nothing (the kernel would zero a bad row of grad).

        Raises:
            TypeError: not an integer NumPy or device array.
            ValueError: not of shape (n,), or a label out of range.
        """
        if not (self._is_buffer(labels) or isinstance(labels, np.ndarray)):
            raise TypeError(
                "softmax_cross_entropy: labels must be an integer NumPy array"
                f" (or a device array), got {type(labels).__name__}"
            )
        if labels.dtype.kind not in "iu":
            raise TypeError(
                f"softmax_cross_entropy: labels must be an integer array, got {labels.dtype}"
            )
        if tuple(labels.shape) != (n,):
            raise ValueError(
                f"softmax_cross_entropy: labels have shape {tuple(labels.shape)},"
                f" expected ({n},) for logits of shape {(n, c)}"
            )
        if n > 0:
            host = labels if isinstance(labels, np.ndarray) else self.to_host(labels)
            _check_labels(host, c)

    def _check_ce_weights(self, weights: Any, c: int, dtype: np.dtype[Any]) -> None:
        """Refuse class weights that are not c floats, finite in ``dtype`` (the
        logits', which the kernel computes in), non-negative and, when not 0,
        normal in ``dtype`` (``check_class_weights``). Weights in the backend's memory must already
        have ``dtype`` and are copied to the host for the check.

        Raises:
            TypeError: not a NumPy or device array, not floating point, or a
                device array of another dtype than the logits.
            ValueError: not of shape (c,), or a weight non-finite, negative
                or rounding to 0.
        """
        if not (self._is_buffer(weights) or isinstance(weights, np.ndarray)):
            raise TypeError(
                "softmax_cross_entropy: weights must be an array or None,"
                f" got {type(weights).__name__}"
            )
        if weights.dtype.kind != "f":
            raise TypeError(
                f"softmax_cross_entropy: weights must be floating point, got {weights.dtype}"
            )
        if tuple(weights.shape) != (c,):
            raise ValueError(
                f"softmax_cross_entropy: weights have shape {tuple(weights.shape)},"
                f" expected ({c},) (one per class)"
            )
        if not isinstance(weights, np.ndarray) and weights.dtype != dtype:
            raise TypeError(
                f"softmax_cross_entropy: weights have dtype {weights.dtype}; expected"
                f" {dtype} (the logits' dtype) for weights already on the device"
            )
        host = weights if isinstance(weights, np.ndarray) else self.to_host(weights)
        check_class_weights("softmax_cross_entropy: weights", host, dtype)

    @abc.abstractmethod
    def softmax_cross_entropy_unchecked(
        self, logits: Any, labels: Any, weights: Any | None, grad: Any
    ) -> tuple[float, float]:
        """``softmax_cross_entropy`` without the checks: labels in range, of an integer
        dtype; ``weights`` None or one per class. See "Unchecked entries"."""

    def mse(self, pred: Any, target: Any, grad: Any) -> float:
        """Fused squared error, forward and backward, as a sum.

        ``loss_sum = sum (pred - target)^2``; ``grad = 2 (pred - target)``.
        Mean reduction (torch's) is ``loss_sum / pred.size``.

        Args:
            pred: any shape.
            target: same shape.
            grad: written, same shape (may be pred itself).

        Returns:
            loss_sum as a Python float (float64 accumulation).

        Raises:
            TypeError: wrong array type or dtype.
            ValueError: shapes differ, not contiguous.
        """
        self.validate("mse", pred=pred, target=target, grad=grad, read_only=("pred", "target"))
        self._same_shape("mse", ("pred", pred), ("target", target), ("grad", grad))
        return float(self.mse_unchecked(self._flat(pred), self._flat(target), self._flat(grad)))

    @abc.abstractmethod
    def mse_unchecked(self, pred: Any, target: Any, grad: Any) -> float:
        """``mse`` without the checks, on flat buffers. See "Unchecked entries" in the class docstring."""


def _check_labels(labels: np.ndarray, classes: int) -> None:
    """ValueError naming the first label outside [0, classes)."""
    bad = np.flatnonzero((labels < 0) | (labels >= classes))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"softmax_cross_entropy: label {int(labels[i])} at row {i} is out of range;"
            f" expected 0 <= label < {classes}"
        )


def check_class_weights(what: str, weights: Any, dtype: Any = np.float64) -> None:
    """The rule for cross-entropy's per-class weights, shared by the backend's
    checked ``softmax_cross_entropy`` and ``LossKind``: every weight is finite
    in ``dtype`` (the dtype the kernel computes in: 1e39 is infinite in
    float32), non-negative, and 0 or at least ``dtype``'s smallest normal
    number: 1e-50 would round to 0 in float32, silently dropping its class
    (a float64 loss keeps it), and the mean's ``1 / weight sum`` of a
    subnormal weight (1e-39 in float32) is infinite.

    Args:
        what: names the weights in the message.
        weights: the weights (anything ``np.asarray`` takes), one per class.
        dtype: the dtype they will be computed in.

    Raises:
        ValueError: naming the first bad weight and its class.
    """
    given = np.asarray(weights).reshape(-1)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        w = given.astype(dtype)
    tiny = np.finfo(dtype).tiny
    low = (given > 0) & (w < tiny)  # 0 or subnormal once cast
    # the sign of the given value: a tiny negative one is -0.0 once cast to float32
    bad = np.flatnonzero(~np.isfinite(w) | (w < 0) | (given < 0) | low)
    if bad.size:
        k = int(bad[0])
        if low[k]:
            how = "rounds to 0" if w[k] == 0 else "is subnormal"
            raise ValueError(
                f"{what}[{k}]={given[k]} {how} in {np.dtype(dtype)}; give 0 or a value >="
                f" {tiny:.2e}, its smallest normal number (a mean divides by the weights'"
                " sum, whose reciprocal is infinite below it)"
            )
        raise ValueError(
            f"{what}: weight {given[k]} of class {k} is refused; class weights must be"
            f" finite in {np.dtype(dtype)} and non-negative"
        )
