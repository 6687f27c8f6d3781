"""CudaBackend: the kernels of a CUDA device (or of numba's simulator), on device arrays.

Buffers are numba device arrays (``cuda.device_array``, ``cuda.to_device``),
float32, C-contiguous. Each op launches the CUDA kernels of
``atomr.accel.kernels`` on the current context; a ``DeviceActor`` makes its
device current on its worker thread. Under ``NUMBA_ENABLE_CUDASIM=1`` every
launch and copy goes through ``atomr.accel.sim_lock``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numba import cuda

from atomr.accel.backend import Backend
from atomr.accel.hyperparameters import AdamHyperparameters, SgdHyperparameters
from atomr.accel.kernels import elementwise, loss, matmul, optim, reduce
from atomr.accel.sim_lock import launch_lock

__all__ = ["CudaBackend", "is_device_array"]


def is_device_array(x: Any) -> bool:
    """True for a numba CUDA device array (real or simulated), False for NumPy arrays.

    Args:
        x: anything.

    Returns:
        Whether x is a device array.
    """
    return (
        not isinstance(x, np.ndarray)
        and hasattr(x, "copy_to_host")
        and hasattr(x, "is_c_contiguous")
    )


def _whole_op_under_launch_lock(cls: type) -> type:
    """Run each op of ``cls`` whole under the launch lock (a no-op on a real GPU).

    The simulator swaps numba.cuda's module state while a kernel runs, so an
    allocation or copy from another device thread must wait for the launch to
    end, not only the launches themselves. The lock is re-entrant.
    """

    def locked(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            with launch_lock():
                return fn(*args, **kwargs)

        return run

    for name, member in list(vars(cls).items()):
        if callable(member) and not name.startswith("__") and name not in _PURE:
            setattr(cls, name, locked(member))
    return cls


_PURE = frozenset({"_is_buffer", "_is_contiguous", "_address"})


@_whole_op_under_launch_lock
class CudaBackend(Backend):
    """The Backend of a CUDA device: buffers are float32 numba device arrays.

    See ``Backend`` for every method's contract. Host NumPy arrays are accepted
    only where the contract says so (labels and class weights of
    ``softmax_cross_entropy``, the argument of ``to_device``).
    """

    _buffer_kind = "numba CUDA device array"

    def _is_buffer(self, x: Any) -> bool:
        return is_device_array(x)

    def _is_contiguous(self, x: Any) -> bool:
        return bool(x.is_c_contiguous())

    def _address(self, x: Any) -> int:
        host = getattr(x, "_ary", None)  # the simulator's array wraps a NumPy array
        if isinstance(host, np.ndarray):
            return int(host.__array_interface__["data"][0])
        return int(x.__cuda_array_interface__["data"][0])

    # memory

    def empty(self, shape: int | tuple[int, ...], dtype: Any = np.float32) -> Any:
        """An uninitialised device array (see ``Backend.empty``)."""
        with launch_lock():
            return cuda.device_array(shape, dtype=dtype)

    def zeros(self, shape: int | tuple[int, ...], dtype: Any = np.float32) -> Any:
        """A zero-filled device array (see ``Backend.zeros``)."""
        with launch_lock():
            return cuda.to_device(np.zeros(shape, dtype=dtype))

    def to_device(self, host: Any) -> Any:
        """Copy a host array to a new device array (see ``Backend.to_device``)."""
        data = np.array(host, order="C", copy=True)  # ascontiguousarray would make 0-d 1-d
        with launch_lock():
            return cuda.to_device(data)

    def to_host(self, buf: Any) -> np.ndarray:
        """Copy a device array to a new NumPy array (see ``Backend.to_host``).

        Raises:
            TypeError: buf is not a device array.
        """
        if not is_device_array(buf):
            raise TypeError(
                f"to_host: buf must be a numba CUDA device array, got {type(buf).__name__}"
            )
        with launch_lock():
            return np.array(buf.copy_to_host(), copy=True)

    def copy_unchecked(self, src: Any, dst: Any) -> None:
        with launch_lock():
            dst.copy_to_device(src)

    def upload_unchecked(self, host: np.ndarray, dst: Any) -> None:
        with launch_lock():  # host to device, straight into dst
            dst.copy_to_device(host)

    def synchronize(self) -> None:
        """Wait for every kernel queued on the current context."""
        with launch_lock():
            cuda.synchronize()

    # kernels

    def matmul_unchecked(
        self, a: Any, b: Any, out: Any, trans_a: bool, trans_b: bool, accumulate: bool
    ) -> None:
        matmul.matmul_cuda(a, b, out, trans_a, trans_b, accumulate)

    def bias_add_unchecked(self, x: Any, bias: Any) -> None:
        elementwise.bias_add_cuda(x, bias)

    def bias_grad_unchecked(self, dy: Any, out: Any, acc: bool) -> None:
        reduce.bias_grad_cuda(dy, out, acc)

    def activation_forward_unchecked(self, code: int, x: Any, out: Any) -> None:
        elementwise.activation_forward_cuda(code, x, out)

    def activation_backward_unchecked(self, code: int, x: Any, dy: Any, dx: Any) -> None:
        elementwise.activation_backward_cuda(code, x, dy, dx)

    def softmax_cross_entropy_unchecked(
        self, logits: Any, labels: Any, weights: Any | None, grad: Any
    ) -> tuple[float, float]:
        if isinstance(labels, np.ndarray):
            labels = self.to_device(labels)
        if isinstance(weights, np.ndarray):
            weights = self.to_device(weights.astype(np.float32))
        elif weights is not None and weights.dtype != np.float32:
            raise TypeError(
                f"softmax_cross_entropy: device weights must be float32, got {weights.dtype}"
            )
        total, wsum, ok = loss.softmax_cross_entropy_cuda(logits, labels, weights, grad)
        if not ok:
            raise ValueError(
                "softmax_cross_entropy: a label is out of range;"
                f" expected 0 <= label < {logits.shape[1]}"
            )
        return total, wsum

    def mse_unchecked(self, pred: Any, target: Any, grad: Any) -> float:
        return loss.mse_cuda(pred, target, grad)

    def axpy_unchecked(self, alpha: Any, x: Any, y: Any) -> None:
        elementwise.axpy_cuda(alpha, x, y)

    def scale_unchecked(self, x: Any, alpha: Any) -> None:
        elementwise.scale_cuda(x, alpha)

    def sum_into_unchecked(self, out: Any, buffers: Sequence[Any]) -> None:
        alias = next((k for k, b in enumerate(buffers) if self._same_memory(b, out)), None)
        reduce.sum_into_cuda(out, buffers, alias)

    def squared_norm_unchecked(self, x: Any) -> float:
        return reduce.squared_norm_cuda(x)

    def sum_scale_norm_unchecked(self, out: Any, buffers: Sequence[Any], alpha: Any) -> float:
        alias = next((k for k, b in enumerate(buffers) if self._same_memory(b, out)), None)
        return reduce.sum_scale_norm_cuda(out, buffers, alpha, alias)

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
        return optim.sgd_step_cuda(p, g, buf, hyper, step, p_out, buf_out)

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
        return optim.adam_step_cuda(p, g, m, v, hyper, step, p_out, m_out, v_out)
