"""Reductions: bias gradient (column sums), sum of several buffers, squared norm.

- ``bias_grad``: ``out (+)= dy.sum(axis=0)``, each column (and out, when
  accumulating) added in float64 and rounded once; CUDA runs one thread per
  column, the CPU twin walks rows in memory order.
- ``sum_into``: ``out = sum_k buffers[k]`` (the reference all-reduce),
  added in float64 in buffer order and rounded once, so both targets give the
  same bits. The CPU twin makes one pass over k buffers; CUDA copies and adds
  for one or two buffers (a float32 sum of two is already rounded once) and
  accumulates three or more in a float64 scratch array. ``out`` may be one
  of the buffers.
- ``squared_norm``: ``sum x^2`` accumulated in float64 (gradient clipping);
  CUDA reduces per block through shared memory and the host adds the block
  sums.
- ``sum_scale_norm``: ``out = sum_k buffers[k] * alpha`` and ``sum out^2``
  (float64): the data-parallel all-reduce, its ``1 / normaliser`` scaling
  and the gradient norm in one pass where it can (the CPU twin fuses two
  buffers, or one scaled in place, into a single read-write sweep). The bits
  of ``out`` equal ``sum_into`` followed by ``x *= alpha``.

The scalar math (``sq``) is written once and compiled for both targets.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numba import float64

from atomr.accel.kernels._compile import (
    BLOCK,
    blocks_for,
    cpu_loop,
    cpu_reduce_loop,
    cpu_scalar,
    cuda,
    gpu_kernel,
    gpu_scalar,
    launch_1d,
)
from atomr.accel.sim_lock import launch_lock

__all__ = [
    "bias_grad_cpu",
    "bias_grad_cuda",
    "scale_norm_cpu",
    "squared_norm_cpu",
    "squared_norm_cuda",
    "sum2_scale_norm_cpu",
    "sum_into_cpu",
    "sum_into_cuda",
    "sum_scale_norm_cuda",
]

# ---------------------------------------------------------------- scalar math


def sq(x: float) -> float:
    """x * x (callers pass x as float64 so the sum accumulates in float64)."""
    return x * x


_sq_cpu = cpu_scalar(sq)
_sq_gpu = gpu_scalar(sq)

# ---------------------------------------------------------------- CUDA


@gpu_kernel
def _bias_grad_kernel(dy, out, accumulate):
    c = cuda.grid(1)
    stride = cuda.gridsize(1)
    while c < dy.shape[1]:
        s = float64(out[c]) if accumulate else float64(0.0)
        for r in range(dy.shape[0]):
            s += float64(dy[r, c])
        out[c] = s
        c += stride


@gpu_kernel
def _add_kernel(src, out):
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < out.size:
        out[i] += src[i]
        i += stride


@gpu_kernel
def _widen_kernel(src, acc):
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < acc.size:
        acc[i] = float64(src[i])
        i += stride


@gpu_kernel
def _widen_add_kernel(src, acc):
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < acc.size:
        acc[i] += float64(src[i])
        i += stride


@gpu_kernel
def _add_narrow_kernel(src, acc, out):
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < out.size:
        out[i] = acc[i] + float64(src[i])  # rounded once, to out's dtype
        i += stride


@gpu_kernel
def _squared_norm_kernel(x, partial):
    acc = cuda.shared.array(BLOCK, float64)
    tid = cuda.threadIdx.x
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    s = 0.0
    while i < x.size:
        s += _sq_gpu(float64(x[i]))
        i += stride
    acc[tid] = s
    cuda.syncthreads()
    half = BLOCK // 2
    while half > 0:
        if tid < half:
            acc[tid] += acc[tid + half]
        cuda.syncthreads()
        half //= 2
    if tid == 0:
        partial[cuda.blockIdx.x] = acc[0]


@gpu_kernel
def _scale_norm_kernel(x, alpha, partial):
    acc = cuda.shared.array(BLOCK, float64)
    tid = cuda.threadIdx.x
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    s = 0.0
    while i < x.size:
        v = x[i] * alpha
        x[i] = v
        s += _sq_gpu(float64(v))
        i += stride
    acc[tid] = s
    cuda.syncthreads()
    half = BLOCK // 2
    while half > 0:
        if tid < half:
            acc[tid] += acc[tid + half]
        cuda.syncthreads()
        half //= 2
    if tid == 0:
        partial[cuda.blockIdx.x] = acc[0]


def bias_grad_cuda(dy: Any, out: Any, accumulate: bool = False) -> None:
    """out (+)= dy.sum(axis=0) on device arrays."""
    launch_1d(_bias_grad_kernel, dy.shape[1], dy, out, bool(accumulate))


def sum_into_cuda(out: Any, buffers: Sequence[Any], alias: int | None = None) -> None:
    """out = sum of buffers on flat device arrays (one pass per buffer), as
    the CPU twin: added in float64 in buffer order, rounded once.

    ``alias`` is the index of the buffer that *is* ``out`` (same memory), if any.
    """
    if len(buffers) > 2:  # a float32 running sum would round at each buffer
        with launch_lock():
            acc = cuda.device_array(out.size, dtype=np.float64)
        launch_1d(_widen_kernel, out.size, buffers[0], acc)
        for b in buffers[1:-1]:
            launch_1d(_widen_add_kernel, out.size, b, acc)
        launch_1d(_add_narrow_kernel, out.size, buffers[-1], acc, out)
        return
    if alias is None:
        with launch_lock():
            out.copy_to_device(buffers[0])
        rest = list(buffers[1:])
    else:
        rest = [b for k, b in enumerate(buffers) if k != alias]
    for b in rest:
        launch_1d(_add_kernel, out.size, b, out)


def squared_norm_cuda(x: Any) -> float:
    """sum(x^2) of a flat device array, float64 block sums added on host."""
    n = x.size
    if n == 0:
        return 0.0
    partial = cuda.device_array(blocks_for(n), dtype=np.float64)
    launch_1d(_squared_norm_kernel, n, x, partial)
    with launch_lock():
        return float(partial.copy_to_host().sum())


def sum_scale_norm_cuda(
    out: Any, buffers: Sequence[Any], alpha: Any, alias: int | None = None
) -> float:
    """out = sum(buffers) * alpha on flat device arrays; returns sum(out^2).

    The sum as ``sum_into_cuda``, then one fused pass scales ``out`` and
    reduces its squares per block (float64, block sums added on host).
    ``alpha`` is a scalar of out's dtype; ``alias`` as for ``sum_into_cuda``.
    """
    sum_into_cuda(out, buffers, alias)
    n = out.size
    if n == 0:
        return 0.0
    with launch_lock():  # the simulator swaps `cuda` while another thread's kernel runs
        partial = cuda.device_array(blocks_for(n), dtype=np.float64)
        launch_1d(_scale_norm_kernel, n, out, alpha, partial)
        return float(partial.copy_to_host().sum())


# ---------------------------------------------------------------- CPU twins


@cpu_loop
def bias_grad_cpu(dy, out, accumulate):
    """out (+)= dy.sum(axis=0), rows walked in memory order, each column
    summed in float64 and rounded once (as the CUDA kernel)."""
    cols = dy.shape[1]
    acc = np.zeros(cols, np.float64)
    if accumulate:
        for c in range(cols):
            acc[c] = out[c]
    for r in range(dy.shape[0]):
        for c in range(cols):
            acc[c] += dy[r, c]
    for c in range(cols):
        out[c] = acc[c]


@cpu_loop
def sum_into_cpu(out, buffers):
    """out = sum of a tuple of flat arrays, one pass (out may be one of them)."""
    for i in range(out.size):
        s = 0.0
        for b in buffers:
            s += b[i]
        out[i] = s


@cpu_reduce_loop
def squared_norm_cpu(x):
    """sum(x^2) of a flat array, float64 accumulation.

    Vectorised (float32 -> float64 conversions, four accumulators); memory
    bound at training sizes, where it matches float32 BLAS ``sdot`` while being
    exact to float64 rounding.
    """
    s = 0.0
    for i in range(x.size):
        s += _sq_cpu(np.float64(x[i]))
    return s


@cpu_reduce_loop
def scale_norm_cpu(x, alpha):
    """x *= alpha (alpha a scalar of x's dtype); returns sum(x^2) in float64.

    One read-write sweep: the scaling of ``scale`` and the sum of
    ``squared_norm`` (same bits for ``x``).
    """
    s = 0.0
    for i in range(x.size):
        v = x[i] * alpha
        x[i] = v
        s += _sq_cpu(np.float64(v))
    return s


@cpu_reduce_loop
def sum2_scale_norm_cpu(out, a, b, alpha):
    """out = (a + b) * alpha in one sweep; returns sum(out^2) in float64.

    The sum is taken in float64 and rounded to out's dtype, then scaled, as
    ``sum_into_cpu`` then ``scale_cpu`` do (same bits); ``out`` may be ``a``
    or ``b``. Two explicit arrays (not a tuple) let LLVM vectorise the loop.
    """
    s = 0.0
    for i in range(out.size):
        v = out.dtype.type(np.float64(a[i]) + np.float64(b[i])) * alpha
        out[i] = v
        s += _sq_cpu(np.float64(v))
    return s
