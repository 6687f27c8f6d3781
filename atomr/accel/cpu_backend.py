"""CpuBackend: the kernels of a (logical) CPU device, on NumPy arrays.

Matmul is BLAS (``np.matmul`` with ``out=``); everything else is a fused
numba ``njit(nogil=True, cache=True)`` loop from ``atomr.accel.kernels``,
so several CPU device actors run their kernels in parallel threads.
Accepts float32 and float64 buffers (one dtype per call).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from atomr.accel.backend import Backend
from atomr.accel.kernels import elementwise, loss, matmul, optim, reduce

__all__ = ["CpuBackend"]

# the weights an unweighted cross-entropy passes (the kernel reads none of
# them, and writes none): one per dtype, not an allocation per call
_NO_WEIGHTS = {np.dtype(t): np.ones(1, dtype=t) for t in (np.float32, np.float64)}


class CpuBackend(Backend):
    """The Backend of a CPU device: buffers are C-contiguous NumPy arrays.

    float32 is the working dtype; float64 is also accepted (all float buffers
    of one call must share the dtype) so that gradients can be checked by
    finite differences in double precision. See ``Backend`` for every method's
    contract.
    """

    float_dtypes = (np.dtype(np.float32), np.dtype(np.float64))
    _buffer_kind = "NumPy array"

    def _is_buffer(self, x: Any) -> bool:
        return isinstance(x, np.ndarray)

    def _is_contiguous(self, x: Any) -> bool:
        return bool(x.flags.c_contiguous)

    def _is_writeable(self, x: Any) -> bool:
        return bool(x.flags.writeable)

    def _address(self, x: Any) -> int:
        return int(x.__array_interface__["data"][0])

    # NumPy's own bounds test costs 0.4 us against 1.8 us for each address
    # read through __array_interface__, and the checked kernels ask it several
    # times per call (issue 22)
    def _overlaps(self, x: Any, y: Any) -> bool:
        # two arrays that each own their memory (not views) are disjoint:
        # known without NumPy's bounds test (several pairs per checked call)
        # (an empty array shares no memory, even with itself: in place is fine)
        if x is y:
            return x.size > 0
        owned = x.base is None and y.base is None and x.flags.owndata and y.flags.owndata
        return not owned and bool(np.may_share_memory(x, y))

    def _same_memory(self, x: Any, y: Any) -> bool:
        return (
            x.nbytes == y.nbytes
            and bool(np.may_share_memory(x, y))
            and self._address(x) == self._address(y)
        )

    # memory

    def empty(self, shape: int | tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
        """An uninitialised NumPy array (see ``Backend.empty``)."""
        return np.empty(shape, dtype=dtype)

    def zeros(self, shape: int | tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
        """A zero-filled NumPy array (see ``Backend.zeros``)."""
        return np.zeros(shape, dtype=dtype)

    def to_device(self, host: Any) -> np.ndarray:
        """A contiguous copy of ``host`` (see ``Backend.to_device``)."""
        return np.array(host, order="C", copy=True)

    def to_host(self, buf: Any) -> np.ndarray:
        """A copy of ``buf`` (see ``Backend.to_host``).

        Raises:
            TypeError: buf is not a NumPy array.
        """
        if not isinstance(buf, np.ndarray):
            raise TypeError(f"to_host: buf must be a NumPy array, got {type(buf).__name__}")
        return buf.copy()

    def copy_unchecked(self, src: Any, dst: Any) -> None:
        np.copyto(dst, src)

    def upload_unchecked(self, host: np.ndarray, dst: Any) -> None:
        np.copyto(dst, host)

    # kernels: those whose arguments are the unchecked op's, as they are
    matmul_unchecked = staticmethod(matmul.matmul_cpu)
    bias_add_unchecked = staticmethod(elementwise.bias_add_cpu)
    bias_grad_unchecked = staticmethod(reduce.bias_grad_cpu)
    axpy_unchecked = staticmethod(elementwise.axpy_cpu)
    scale_unchecked = staticmethod(elementwise.scale_cpu)
    sgd_step_unchecked = staticmethod(optim.sgd_step_cpu)
    adam_step_unchecked = staticmethod(optim.adam_step_cpu)

    def activation_forward_unchecked(self, code: int, x: Any, out: Any) -> None:
        elementwise.activation_forward_cpu(code, x, out, x.dtype == np.float32)

    def activation_backward_unchecked(self, code: int, x: Any, dy: Any, dx: Any) -> None:
        elementwise.activation_backward_cpu(code, x, dy, dx, x.dtype == np.float32)

    def softmax_cross_entropy_unchecked(
        self, logits: Any, labels: Any, weights: Any | None, grad: Any
    ) -> tuple[float, float]:
        w: Any = _NO_WEIGHTS.get(logits.dtype)
        if weights is not None:
            w = np.ascontiguousarray(weights, dtype=logits.dtype)
        elif w is None:
            w = np.ones(1, dtype=logits.dtype)
        labels = np.ascontiguousarray(labels)
        total, wsum, bad = loss.softmax_cross_entropy_cpu(
            logits, labels, w, weights is not None, grad, logits.dtype == np.float32
        )
        if bad >= 0:  # pragma: no cover - checked and trusted callers pass labels in range
            raise ValueError(f"softmax_cross_entropy: label at row {bad} is out of range")
        return total, wsum

    def mse_unchecked(self, pred: Any, target: Any, grad: Any) -> float:
        return float(loss.mse_cpu(pred, target, grad))

    def sum_into_unchecked(self, out: Any, buffers: Sequence[Any]) -> None:
        reduce.sum_into_cpu(out, _uniform(buffers))

    def squared_norm_unchecked(self, x: Any) -> float:
        return float(reduce.squared_norm_cpu(x))

    def sum_scale_norm_unchecked(self, out: Any, buffers: Sequence[Any], alpha: Any) -> float:
        if len(buffers) == 2:
            return float(reduce.sum2_scale_norm_cpu(out, buffers[0], buffers[1], alpha))
        if len(buffers) == 1:
            if buffers[0] is not out:
                np.copyto(out, buffers[0])
        else:
            reduce.sum_into_cpu(out, _uniform(buffers))
        return float(reduce.scale_norm_cpu(out, alpha))


def _uniform(flats: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    """The arrays as one tuple numba can loop over: when some are read-only (a
    distinct numba type), read-only views of all of them."""
    for f in flats:
        if not f.flags.writeable:
            break
    else:
        return tuple(flats)
    views = tuple(f.view() for f in flats)
    for v in views:
        v.flags.writeable = False
    return views
