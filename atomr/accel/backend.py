"""The Backend facade: the kernels of one device behind one set of methods.

``backend_for(device)`` gives a ``CpuBackend`` (NumPy arrays) or a
``CudaBackend`` (numba device arrays). Both have the same methods and give
the same results (float tolerance); every op writes into caller-provided
buffers. This base class validates the arguments (types, dtypes, shapes,
contiguity) with clear ``TypeError`` / ``ValueError`` messages before any
launch, then calls the subclass's ``_op`` implementation.

Buffers are float32. The CPU backend also accepts float64 (all float
buffers of one call must then share it), so that finite-difference gradient
checks can run in double precision; the CUDA backend is float32 only.
Buffers must be C-contiguous. Labels are any integer dtype.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np

from atomr.accel.device import Device, cuda_device_count
from atomr.accel.hyperparameters import AdamHyperparameters, SgdHyperparameters
from atomr.accel.kernels.elementwise import ACTIVATIONS

__all__ = ["ACTIVATIONS", "Backend", "backend_for"]


class Backend(abc.ABC):
    """The kernels and memory of one device. Use ``backend_for(device)`` to get one.

    All ops validate their inputs first and raise ``TypeError`` (wrong array type
    or dtype) or ``ValueError`` (wrong shape, non-contiguous, read-only, bad
    argument value) without touching any buffer.

    Unchecked entries: each op ``name`` is ``validate``, then
    ``name_unchecked``, which launches the kernel at once. A caller that made
    and shaped its buffers itself (a model's forward and backward over its own
    parameters and activations, a loss on the model's output with targets
    validated at the trainer's boundary, an optimizer over buffers it checked
    once) may call ``name_unchecked`` directly and skip the checks it already
    knows hold. Such a caller guarantees what the checks would: buffers of this
    backend, C-contiguous, of one float dtype, shapes that fit, writable
    outputs that do not overlap the inputs where the op forbids it; element-wise
    ops and reductions take flat (1-D) buffers and scalars of the buffers'
    dtype. Nothing is checked, so a wrong argument may give wrong numbers or a
    numba error instead of a clear ``TypeError`` / ``ValueError``: users'
    code should call the checked ops.
    """

    #: the float dtypes this backend computes in (float32 first: the default)
    float_dtypes: tuple[np.dtype[Any], ...] = (np.dtype(np.float32),)

    def __init__(self, device: Device) -> None:
        self.device = device

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.device})"

    # ------------------------------------------------------------ subclass hooks

    @abc.abstractmethod
    def _is_buffer(self, x: Any) -> bool:
        """True when ``x`` is this backend's array type."""

    @abc.abstractmethod
    def _is_contiguous(self, x: Any) -> bool:
        """True when ``x`` is C-contiguous."""

    def _is_writeable(self, x: Any) -> bool:
        """True when ``x`` may be written (NumPy's flag; device arrays always)."""
        return True

    @abc.abstractmethod
    def _address(self, x: Any) -> int:
        """The address of ``x``'s first element (host or device memory)."""

    def _overlaps(self, x: Any, y: Any) -> bool:
        """True when the (contiguous) buffers ``x`` and ``y`` share memory."""
        if x.nbytes == 0 or y.nbytes == 0:
            return False
        x0, y0 = self._address(x), self._address(y)
        return x0 < y0 + y.nbytes and y0 < x0 + x.nbytes

    def _same_memory(self, x: Any, y: Any) -> bool:
        """True when the (contiguous) buffers ``x`` and ``y`` are the same memory."""
        return x.nbytes == y.nbytes and self._address(x) == self._address(y)

    _buffer_kind = "array"

    # ------------------------------------------------------------ memory

    @abc.abstractmethod
    def empty(self, shape: int | tuple[int, ...], dtype: Any = np.float32) -> Any:
        """An uninitialised buffer on this device.

        Args:
            shape: the shape.
            dtype: the element type (float32 by default; integer types for labels).

        Returns:
            The buffer.
        """

    @abc.abstractmethod
    def zeros(self, shape: int | tuple[int, ...], dtype: Any = np.float32) -> Any:
        """A zero-filled buffer on this device.

        Args:
            shape: the shape.
            dtype: the element type.

        Returns:
            The buffer.
        """

    @abc.abstractmethod
    def to_device(self, host: Any) -> Any:
        """Copy a host array (anything ``np.asarray`` takes) into a new buffer on this device.

        Args:
            host: the data; made C-contiguous, dtype kept.

        Returns:
            A new buffer that shares no memory with ``host``.
        """

    @abc.abstractmethod
    def to_host(self, buf: Any) -> np.ndarray:
        """Copy a buffer of this device into a new NumPy array.

        Args:
            buf: the buffer.

        Returns:
            A new array that shares no memory with ``buf``.

        Raises:
            TypeError: buf is not this backend's array type.
        """

    def copy(self, src: Any, dst: Any) -> None:
        """``dst[...] = src`` between two buffers of this device.

        Args:
            src: the source buffer.
            dst: the destination, same shape and dtype.

        Raises:
            TypeError: not buffers of this backend, or dtypes differ.
            ValueError: shapes differ, or a buffer is not contiguous.
        """
        self.validate("copy", src=src, dst=dst, any_dtype=True, read_only=("src",))
        self._same_shape("copy", ("src", src), ("dst", dst))
        self.copy_unchecked(src, dst)

    @abc.abstractmethod
    def copy_unchecked(self, src: Any, dst: Any) -> None:
        """``copy`` without the checks: ``dst[...] = src``. See "Unchecked entries" in the class docstring."""

    def synchronize(self) -> None:
        """Wait until all work queued on this device is done (a no-op on the CPU)."""
        return None

    # ------------------------------------------------------------ matmul

    def matmul(
        self,
        a: Any,
        b: Any,
        out: Any,
        trans_a: bool = False,
        trans_b: bool = False,
        accumulate: bool = False,
    ) -> None:
        """``out (+)= op(a) @ op(b)``, op the transpose when ``trans_*`` is set.

        Args:
            a: 2-D, (m, k), or (k, m) with trans_a.
            b: 2-D, (k, n), or (n, k) with trans_b.
            out: 2-D (m, n), written (or added to with ``accumulate``); must not
                overlap a or b.
            trans_a: use a.T.
            trans_b: use b.T.
            accumulate: add to ``out`` instead of overwriting it.

        Raises:
            TypeError: wrong array type or dtype, mixed dtypes.
            ValueError: not 2-D, inner or output dimensions mismatch, not contiguous,
                out overlaps a or b.
        """
        self.validate("matmul", a=a, b=b, out=out, read_only=("a", "b"))
        self._ndim("matmul", 2, a=a, b=b, out=out)
        m, ka = (a.shape[1], a.shape[0]) if trans_a else (a.shape[0], a.shape[1])
        kb, n = (b.shape[1], b.shape[0]) if trans_b else (b.shape[0], b.shape[1])
        if ka != kb:
            raise ValueError(
                f"matmul: inner dimensions differ: op(a) is ({m}, {ka}), op(b) is ({kb}, {n})"
                f" (trans_a={trans_a}, trans_b={trans_b})"
            )
        if tuple(out.shape) != (m, n):
            raise ValueError(f"matmul: out has shape {tuple(out.shape)}, expected ({m}, {n})")
        for name, x in (("a", a), ("b", b)):
            if self._overlaps(out, x):
                raise ValueError(f"matmul: out overlaps {name}; write to a separate buffer")
        self.matmul_unchecked(a, b, out, bool(trans_a), bool(trans_b), bool(accumulate))

    @abc.abstractmethod
    def matmul_unchecked(
        self, a: Any, b: Any, out: Any, trans_a: bool, trans_b: bool, accumulate: bool
    ) -> None:
        """``matmul`` without the checks. See "Unchecked entries" in the class docstring."""

    # ------------------------------------------------------------ bias

    def bias_add(self, x: Any, bias: Any) -> None:
        """``x[i, :] += bias`` in place.

        Args:
            x: 2-D (n, f).
            bias: 1-D (f,).

        Raises:
            TypeError: wrong array type or dtype.
            ValueError: shapes do not match, not contiguous.
        """
        self.validate("bias_add", x=x, bias=bias, read_only=("bias",))
        self._ndim("bias_add", 2, x=x)
        self._ndim("bias_add", 1, bias=bias)
        if bias.shape[0] != x.shape[1]:
            raise ValueError(
                f"bias_add: bias has shape {tuple(bias.shape)}, expected ({x.shape[1]},)"
                f" for x of shape {tuple(x.shape)}"
            )
        self.bias_add_unchecked(x, bias)

    @abc.abstractmethod
    def bias_add_unchecked(self, x: Any, bias: Any) -> None:
        """``bias_add`` without the checks. See "Unchecked entries" in the class docstring."""

    def bias_grad(self, dy: Any, out: Any, accumulate: bool = False) -> None:
        """``out (+)= dy.sum(axis=0)``: the bias gradient.

        Args:
            dy: 2-D (n, f), the gradient of the layer output.
            out: 1-D (f,).
            accumulate: add to ``out`` instead of overwriting it.

        Raises:
            TypeError: wrong array type or dtype.
            ValueError: shapes do not match, not contiguous.
        """
        self.validate("bias_grad", dy=dy, out=out, read_only=("dy",))
        self._ndim("bias_grad", 2, dy=dy)
        self._ndim("bias_grad", 1, out=out)
        if out.shape[0] != dy.shape[1]:
            raise ValueError(
                f"bias_grad: out has shape {tuple(out.shape)}, expected ({dy.shape[1]},)"
            )
        self.bias_grad_unchecked(dy, out, bool(accumulate))

    @abc.abstractmethod
    def bias_grad_unchecked(self, dy: Any, out: Any, acc: bool) -> None:
        """``bias_grad`` without the checks. See "Unchecked entries" in the class docstring."""

    # ------------------------------------------------------------ activations

    def activation_forward(self, kind: str, x: Any, out: Any) -> None:
        """``out = f(x)``, f one of identity, relu, tanh, gelu (tanh approximation).

        Args:
            kind: the activation's name.
            x: any shape.
            out: same shape as x (may be x itself).

        Raises:
            ValueError: unknown kind, shapes differ, not contiguous.
            TypeError: wrong array type or dtype.
        """
        code = self._activation("activation_forward", kind)
        self.validate("activation_forward", x=x, out=out, read_only=("x",))
        self._same_shape("activation_forward", ("x", x), ("out", out))
        self.activation_forward_unchecked(code, self._flat(x), self._flat(out))

    def activation_backward(self, kind: str, x: Any, dy: Any, dx: Any) -> None:
        """``dx = dy * f'(x)``, x the pre-activation.

        Args:
            kind: the activation's name.
            x: the pre-activation, any shape.
            dy: the gradient of the activation's output, same shape.
            dx: written, same shape (may be dy itself).

        Raises:
            ValueError: unknown kind, shapes differ, not contiguous.
            TypeError: wrong array type or dtype.
        """
        code = self._activation("activation_backward", kind)
        self.validate("activation_backward", x=x, dy=dy, dx=dx, read_only=("x", "dy"))
        self._same_shape("activation_backward", ("x", x), ("dy", dy), ("dx", dx))
        self.activation_backward_unchecked(code, self._flat(x), self._flat(dy), self._flat(dx))

    @abc.abstractmethod
    def activation_forward_unchecked(self, code: int, x: Any, out: Any) -> None:
        """``activation_forward`` without the checks, on flat buffers; ``code`` is ``ACTIVATIONS[kind]``. See "Unchecked entries" in the class docstring."""

    @abc.abstractmethod
    def activation_backward_unchecked(self, code: int, x: Any, dy: Any, dx: Any) -> None:
        """``activation_backward`` without the checks, on flat buffers; ``code`` is ``ACTIVATIONS[kind]``. See "Unchecked entries" in the class docstring."""

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
            labels: 1-D (n,) integer class indices in [0, c): a host NumPy array,
                or (CUDA) a device array.
            weights: per-class weights (c,) or None; a host array is accepted by
                both backends.
            grad: written, (n, c); may be ``logits`` itself.

        Returns:
            (loss_sum, weight_sum) as Python floats.

        Raises:
            TypeError: wrong array type or dtype, labels not integers.
            ValueError: shape mismatch, not contiguous, a label out of range.
        """
        self.validate("softmax_cross_entropy", logits=logits, grad=grad, read_only=("logits",))
        self._ndim("softmax_cross_entropy", 2, logits=logits)
        self._same_shape("softmax_cross_entropy", ("logits", logits), ("grad", grad))
        n, c = logits.shape
        if c == 0:
            raise ValueError("softmax_cross_entropy: logits need at least one class (c >= 1)")
        if self._is_buffer(labels) or isinstance(labels, np.ndarray):
            if labels.dtype.kind not in "iu":
                raise TypeError(
                    f"softmax_cross_entropy: labels must be an integer array, got {labels.dtype}"
                )
            if tuple(labels.shape) != (n,):
                raise ValueError(
                    f"softmax_cross_entropy: labels have shape {tuple(labels.shape)},"
                    f" expected ({n},) for logits of shape {(n, c)}"
                )
        else:
            raise TypeError(
                "softmax_cross_entropy: labels must be an integer NumPy array"
                f" (or a device array), got {type(labels).__name__}"
            )
        if isinstance(labels, np.ndarray) and n > 0:
            _check_labels(labels, c)
        if weights is not None:
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
        loss, wsum = self.softmax_cross_entropy_unchecked(logits, labels, weights, grad)
        return float(loss), float(wsum)

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

    # ------------------------------------------------------------ blas-1 and reductions

    def axpy(self, alpha: float, x: Any, y: Any) -> None:
        """``y += alpha * x``.

        Args:
            alpha: the scale.
            x: any shape.
            y: same shape, updated in place.

        Raises:
            TypeError: wrong array type or dtype, alpha not a real number.
            ValueError: shapes differ, not contiguous.
        """
        alpha = _real("axpy", "alpha", alpha)
        self.validate("axpy", x=x, y=y, read_only=("x",))
        self._same_shape("axpy", ("x", x), ("y", y))
        self.axpy_unchecked(y.dtype.type(alpha), self._flat(x), self._flat(y))

    @abc.abstractmethod
    def axpy_unchecked(self, alpha: Any, x: Any, y: Any) -> None:
        """``axpy`` without the checks, on flat buffers; ``alpha`` a scalar of their dtype. See "Unchecked entries" in the class docstring."""

    def scale(self, x: Any, alpha: float) -> None:
        """``x *= alpha`` in place.

        Args:
            x: any shape.
            alpha: the scale.

        Raises:
            TypeError: wrong array type or dtype, alpha not a real number.
            ValueError: not contiguous.
        """
        alpha = _real("scale", "alpha", alpha)
        self.validate("scale", x=x)
        self.scale_unchecked(self._flat(x), x.dtype.type(alpha))

    @abc.abstractmethod
    def scale_unchecked(self, x: Any, alpha: Any) -> None:
        """``scale`` without the checks, on a flat buffer; ``alpha`` a scalar of its dtype. See "Unchecked entries" in the class docstring."""

    def sum_into(self, out: Any, buffers: Sequence[Any]) -> None:
        """``out = sum(buffers)`` element-wise (the reference all-reduce).

        Args:
            out: written; may be one of ``buffers``.
            buffers: one or more buffers of out's shape and dtype.

        Raises:
            TypeError: wrong array type or dtype, buffers not a sequence.
            ValueError: no buffers, shapes differ, not contiguous.
        """
        if not isinstance(buffers, Sequence) or isinstance(buffers, str | bytes):
            raise TypeError(
                f"sum_into: buffers must be a list or tuple, got {type(buffers).__name__}"
            )
        if len(buffers) == 0:
            raise ValueError("sum_into: needs at least one buffer")
        named = {f"buffers[{k}]": b for k, b in enumerate(buffers)}
        self.validate("sum_into", out=out, read_only=tuple(named), **named)
        self._same_shape("sum_into", ("out", out), *named.items())
        self.sum_into_unchecked(self._flat(out), [self._flat(b) for b in buffers])

    @abc.abstractmethod
    def sum_into_unchecked(self, out: Any, buffers: Sequence[Any]) -> None:
        """``sum_into`` on trusted flat buffers (see "Unchecked entries")."""

    def sum_scale_norm(self, out: Any, buffers: Sequence[Any], alpha: float) -> float:
        """``out = sum(buffers) * alpha`` and its ``sum(out^2)`` (float64), fused.

        The bits of ``out`` equal ``sum_into(out, buffers)`` then
        ``scale(out, alpha)``; the returned value is ``squared_norm(out)`` up to
        the order of the float64 additions. ``sum_scale_norm(g, [g], s)``
        scales ``g`` in place and measures it in one pass.

        Args:
            out: written; may be one of ``buffers``.
            buffers: one or more buffers of out's shape and dtype.
            alpha: the scale.

        Returns:
            ``sum(out^2)`` as a Python float (inf or NaN when not finite).

        Raises:
            TypeError: wrong array type or dtype, buffers not a sequence,
                alpha not a real number.
            ValueError: no buffers, shapes differ, not contiguous.
        """
        alpha = _real("sum_scale_norm", "alpha", alpha)
        if not isinstance(buffers, Sequence) or isinstance(buffers, str | bytes):
            raise TypeError(
                f"sum_scale_norm: buffers must be a list or tuple, got {type(buffers).__name__}"
            )
        if len(buffers) == 0:
            raise ValueError("sum_scale_norm: needs at least one buffer")
        named = {f"buffers[{k}]": b for k, b in enumerate(buffers)}
        self.validate("sum_scale_norm", out=out, read_only=tuple(named), **named)
        self._same_shape("sum_scale_norm", ("out", out), *named.items())
        return float(
            self.sum_scale_norm_unchecked(
                self._flat(out), [self._flat(b) for b in buffers], out.dtype.type(alpha)
            )
        )

    @abc.abstractmethod
    def sum_scale_norm_unchecked(self, out: Any, buffers: Sequence[Any], alpha: Any) -> float:
        """``sum_scale_norm`` on trusted flat buffers, ``alpha`` a scalar of their
        dtype; returns the raw sum (see "Unchecked entries")."""

    def squared_norm(self, x: Any) -> float:
        """``sum(x^2)`` accumulated in float64 (gradient clipping: norm = sqrt of it).

        Args:
            x: any shape.

        Returns:
            The sum as a Python float.

        Raises:
            TypeError: wrong array type or dtype.
            ValueError: not contiguous.
        """
        self.validate("squared_norm", x=x, read_only=("x",))
        return float(self.squared_norm_unchecked(self._flat(x)))

    @abc.abstractmethod
    def squared_norm_unchecked(self, x: Any) -> float:
        """``squared_norm`` without the checks, on a flat buffer. See "Unchecked entries" in the class docstring."""

    # ------------------------------------------------------------ optimizers

    def sgd_step(
        self,
        params: Any,
        grads: Any,
        momentum_buf: Any | None,
        hyperparameters: SgdHyperparameters,
        step: int,
        *,
        params_out: Any | None = None,
        momentum_out: Any | None = None,
    ) -> bool:
        """One fused torch.optim.SGD step over a flat parameter buffer, in place
        or (``params_out`` / ``momentum_out``) out of place.

        Args:
            params: the parameters, updated in place.
            grads: their gradients (read only), same shape.
            momentum_buf: the momentum buffer (same shape, updated in place); may be
                None when ``momentum == 0``. Its content is ignored on step 1 (torch's
                first-step rule ``buf = grad``), so it need not be zeroed.
            hyperparameters: lr, momentum, dampening, weight decay and nesterov,
                validated when they were built (they are not checked again here).
            step: the 1-based step number (1 on the first step).
            params_out: where the new parameters go (same shape; default ``params``):
                out of place, ``params`` is read only.
            momentum_out: where the new momentum buffer goes (default ``momentum_buf``).
                With ``params_out``, the inputs are left as they were and the results
                are bit-identical to the in-place step's.

        Returns:
            True when every new parameter is finite (checked in the same pass;
            the results are written either way).

        Raises:
            TypeError: wrong array type or dtype, or ``hyperparameters`` is not an
                ``SgdHyperparameters``.
            ValueError: shapes differ, not contiguous, a step below 1, missing buffer.
        """
        if not isinstance(hyperparameters, SgdHyperparameters):
            raise TypeError(
                "sgd_step: hyperparameters must be an SgdHyperparameters,"
                f" got {type(hyperparameters).__name__}"
            )
        _step_number("sgd_step", step)
        if hyperparameters.momentum != 0 and momentum_buf is None:
            raise ValueError("sgd_step: momentum != 0 needs a momentum_buf")
        bufs: dict[str, Any] = {"params": params, "grads": grads}
        if momentum_buf is not None:
            bufs["momentum_buf"] = momentum_buf
        if params_out is not None:
            bufs["params_out"] = params_out
        if momentum_out is not None:
            if momentum_buf is None:
                raise ValueError("sgd_step: momentum_out needs a momentum_buf")
            bufs["momentum_out"] = momentum_out
        read_only = ["grads"] + ["params"] * (params_out is not None)
        read_only += ["momentum_buf"] * (momentum_out is not None)
        self.validate("sgd_step", read_only=read_only, **bufs)
        self._same_shape("sgd_step", *bufs.items())
        flat_p = self._flat(params)
        flat_buf = self._flat(momentum_buf) if momentum_buf is not None else flat_p
        out_p = self._flat(params_out) if params_out is not None else flat_p
        out_buf = self._flat(momentum_out) if momentum_out is not None else flat_buf
        if momentum_buf is None:
            out_buf = out_p
        return self.sgd_step_unchecked(
            flat_p, self._flat(grads), flat_buf, hyperparameters, step, out_p, out_buf
        )

    @abc.abstractmethod
    def sgd_step_unchecked(
        self,
        p: Any,
        g: Any,
        buf: Any,
        hyper: SgdHyperparameters,
        step: int,
        p_out: Any,
        buf_out: Any,
    ) -> bool:
        """``sgd_step`` without the checks, on flat buffers; every output given (the input itself for in place; ``buf`` and ``buf_out`` may be ``p`` and ``p_out`` when momentum is 0). See "Unchecked entries" in the class docstring."""

    def adam_step(
        self,
        params: Any,
        grads: Any,
        exp_avg: Any,
        exp_avg_sq: Any,
        hyperparameters: AdamHyperparameters,
        step: int,
        *,
        params_out: Any | None = None,
        exp_avg_out: Any | None = None,
        exp_avg_sq_out: Any | None = None,
    ) -> bool:
        """One fused torch.optim.Adam (or AdamW, ``decoupled=True``) step, in place
        or (the ``*_out`` buffers) out of place.

        Adam adds ``weight_decay * p`` to the gradient (coupled L2); AdamW first
        scales ``p *= 1 - lr * weight_decay``. See ``atomr.accel.kernels.optim``
        for the exact formulas.

        Args:
            params: the parameters, updated in place.
            grads: their gradients (read only), same shape.
            exp_avg: first moment m (zeros before step 1), updated in place.
            exp_avg_sq: second moment v (zeros before step 1), updated in place.
            hyperparameters: lr, betas, eps, weight decay and ``decoupled``,
                validated when they were built (they are not checked again here).
            step: the 1-based step number t used in the bias corrections.
            params_out, exp_avg_out, exp_avg_sq_out: where the new parameters and
                moments go (same shape; each defaults to its input, in place). Out of
                place, the inputs are left as they were and the results are
                bit-identical to the in-place step's.

        Returns:
            True when every new parameter is finite (checked in the same pass;
            the results are written either way).

        Raises:
            TypeError: wrong array type or dtype, or ``hyperparameters`` is not an
                ``AdamHyperparameters``.
            ValueError: shapes differ, not contiguous, a step below 1.
        """
        if not isinstance(hyperparameters, AdamHyperparameters):
            raise TypeError(
                "adam_step: hyperparameters must be an AdamHyperparameters,"
                f" got {type(hyperparameters).__name__}"
            )
        _step_number("adam_step", step)
        bufs = {"params": params, "grads": grads, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}
        outs = {"params": params_out, "exp_avg": exp_avg_out, "exp_avg_sq": exp_avg_sq_out}
        for name, out in outs.items():
            if out is not None:
                bufs[f"{name}_out"] = out
        read_only = ["grads"] + [name for name, out in outs.items() if out is not None]
        self.validate("adam_step", read_only=read_only, **bufs)
        self._same_shape("adam_step", *bufs.items())
        flat = {name: self._flat(bufs[name] if out is None else out) for name, out in outs.items()}
        return self.adam_step_unchecked(
            self._flat(params),
            self._flat(grads),
            self._flat(exp_avg),
            self._flat(exp_avg_sq),
            hyperparameters,
            step,
            flat["params"],
            flat["exp_avg"],
            flat["exp_avg_sq"],
        )

    @abc.abstractmethod
    def adam_step_unchecked(
        self,
        p: Any,
        g: Any,
        m: Any,
        v: Any,
        hyper: AdamHyperparameters,
        step: int,
        p_out: Any,
        m_out: Any,
        v_out: Any,
    ) -> bool:
        """``adam_step`` without the checks, on flat buffers; every output given (the input itself for in place). See "Unchecked entries" in the class docstring."""

    # ------------------------------------------------------------ validation helpers

    def _flat(self, x: Any) -> Any:
        """A 1-D view of a contiguous buffer."""
        return x.reshape(-1) if x.ndim != 1 else x

    def _activation(self, op: str, kind: str) -> int:
        if not isinstance(kind, str) or kind.lower() not in ACTIVATIONS:
            raise ValueError(
                f"{op}: unknown activation {kind!r}; expected one of {', '.join(ACTIVATIONS)}"
            )
        return ACTIVATIONS[kind.lower()]

    def validate(
        self, op: str, any_dtype: bool = False, read_only: Collection[str] = (), **buffers: Any
    ) -> None:
        """Check the buffers of one call of op ``op`` (what every checked op does first).

        Args:
            op: the op's name, for the messages.
            any_dtype: accept any dtype (else only ``float_dtypes``); all must share one.
            read_only: the names of the buffers the op only reads (the others
                must be writable).
            **buffers: the buffers by name.

        Raises:
            TypeError: not a buffer of this backend, a dtype not accepted, or
                mixed dtypes.
            ValueError: not C-contiguous, or a buffer to write that is read-only.
        """
        dtype = None
        for name, x in buffers.items():
            if not self._is_buffer(x):
                raise TypeError(
                    f"{op}: {name} must be a {self._buffer_kind} for {self.device},"
                    f" got {type(x).__name__}"
                )
            if not any_dtype and x.dtype not in self.float_dtypes:
                accepted = " or ".join(str(d) for d in self.float_dtypes)
                raise TypeError(
                    f"{op}: {name} has dtype {x.dtype}; {type(self).__name__} accepts {accepted}"
                )
            if dtype is None:
                dtype = x.dtype
            elif x.dtype != dtype:
                raise TypeError(
                    f"{op}: mixed dtypes: {name} is {x.dtype} but"
                    f" {next(iter(buffers))} is {dtype}; use one dtype for all buffers"
                )
            if not self._is_contiguous(x):
                raise ValueError(
                    f"{op}: {name} is not C-contiguous (a transposed or sliced view?);"
                    " pass a contiguous copy"
                )
            if name not in read_only and not self._is_writeable(x):
                raise ValueError(f"{op}: {name} is read-only")

    @staticmethod
    def _ndim(op: str, ndim: int, **buffers: Any) -> None:
        for name, x in buffers.items():
            if x.ndim != ndim:
                raise ValueError(f"{op}: {name} must be {ndim}-D, got shape {tuple(x.shape)}")

    @staticmethod
    def _same_shape(op: str, *named: tuple[str, Any]) -> None:
        (first_name, first), *rest = named
        for name, x in rest:
            if tuple(x.shape) != tuple(first.shape):
                raise ValueError(
                    f"{op}: {name} has shape {tuple(x.shape)} but {first_name} has"
                    f" shape {tuple(first.shape)}; they must match"
                )


def _check_labels(labels: np.ndarray, classes: int) -> None:
    """ValueError naming the first label outside [0, classes)."""
    bad = np.flatnonzero((labels < 0) | (labels >= classes))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"softmax_cross_entropy: label {int(labels[i])} at row {i} is out of range;"
            f" expected 0 <= label < {classes}"
        )


def _real(op: str, name: str, value: Any) -> float:
    """``value`` as a finite float, or TypeError / ValueError."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise TypeError(f"{op}: {name} must be a real number, got {type(value).__name__}")
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"{op}: {name} must be finite, got {v}")
    return v


def _step_number(op: str, step: Any) -> None:
    if isinstance(step, bool) or not isinstance(step, int | np.integer) or step < 1:
        raise ValueError(f"{op}: step must be an int >= 1 (1-based), got {step!r}")


_BACKENDS: dict[Device, Backend] = {}


def backend_for(device: Device | str) -> Backend:
    """The Backend of a device (one instance per device, created on first use).

    Args:
        device: a Device or a name such as "cpu:0" or "cuda:0".

    Returns:
        A ``CpuBackend`` for "cpu:N", a ``CudaBackend`` for "cuda:N".

    Raises:
        ValueError: unknown device name, or a CUDA device this machine does not
            have (the message says how many there are).
    """
    dev = Device.parse(device)
    found = _BACKENDS.get(dev)
    if found is not None:
        return found
    backend: Backend
    if dev.is_cpu:
        from atomr.accel.cpu_backend import CpuBackend

        backend = CpuBackend(dev)
    else:
        count = cuda_device_count()
        if dev.index >= count:
            raise ValueError(
                f"no such device {dev}: this machine has {count} CUDA device(s)"
                + ("" if count else " (numba.cuda is not available; use a cpu device)")
            )
        from atomr.accel.cuda_backend import CudaBackend

        backend = CudaBackend(dev)
    return _BACKENDS.setdefault(dev, backend)
