"""Loss kernels, forward and backward fused: softmax cross-entropy and MSE.

Both return *sums* (the trainers add sums across shards and divide once):

- softmax cross-entropy over rows of ``logits`` (n, c) with integer labels:
  ``loss_sum = sum_i w[y_i] * (logsumexp(logits_i) - logits_i[y_i])``,
  ``weight_sum = sum_i w[y_i]`` (w = 1 without weights),
  ``grad_ij = w[y_i] * (softmax(logits_i)_j - [j == y_i])``.
- MSE: ``loss_sum = sum (pred - target)^2`` (float64), ``grad = 2 (pred - target)``.

The per-row / per-element math is written once (``ce_row``, ``sq_diff``) and
compiled for both targets. On CUDA, CE runs one thread per row and writes
per-row losses that the host sums (float64); MSE reduces per block through
shared memory. Labels out of range are reported through a flag (CUDA) or a
return code (CPU) and turned into ``ValueError`` by the backend.

``grad`` may be the same buffer as ``logits``: each row is read before its
gradient is written.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import float64

from atomr.accel.kernels._compile import (
    BLOCK,
    blocks_for,
    cpu_math_loop,
    cpu_reduce_loop,
    cpu_scalar,
    cuda,
    gpu_kernel,
    gpu_scalar,
    launch_1d,
)
from atomr.accel.kernels._fastmath import fexp
from atomr.accel.sim_lock import launch_lock

__all__ = [
    "mse_cpu",
    "mse_cuda",
    "softmax_cross_entropy_cpu",
    "softmax_cross_entropy_cuda",
]

# ---------------------------------------------------------------- scalar math


def ce_row(logits: Any, grad: Any, i: int, y: int, w: float, approx: bool) -> float:
    """Row i of softmax cross-entropy: writes grad[i, :], returns w * (-log p_y).

    One exp per element: the exponentials go to grad[i, :] (after logits[i, y]
    is read, so grad may be logits), are summed, then scaled by w / sum.
    ``approx``: the vectorisable float32 exp (CPU, float32 buffers).

    The sum of the exponentials and the loss are float64, as compiled code
    types them (a float32 plus a float64 is a float64); the ``float64(...)``
    casts say so for the CUDA simulator too, where NumPy 2 would keep a float32
    scalar plus a Python float in float32 (``[[3e38, -3e38, 0]]`` with label 1
    gave an infinite loss there, 6e38 on a GPU and on the CPU twin).
    """
    c = logits.shape[1]
    m = logits[i, 0]
    for j in range(1, c):
        v = logits[i, j]
        m = v if v > m else m
    ly = float64(logits[i, y])
    for j in range(c):
        grad[i, j] = fexp(logits[i, j] - m, approx)
    s = 0.0
    for j in range(c):
        s += float64(grad[i, j])
    loss = w * (float64(m) + math.log(s) - ly)
    r = w / s
    for j in range(c):
        grad[i, j] = grad[i, j] * r
    grad[i, y] = grad[i, y] - w
    return loss


def sq_diff(p: float, t: float) -> tuple[float, float]:
    """(d^2, 2d) for d = p - t: the MSE term and its derivative.

    Callers pass p and t as float64: d^2 then neither overflows nor
    underflows in float32 (d = 1e20 gives 1e40, not inf), and 2d stored in a
    float32 grad is the float32 ``2 * (p - t)`` bit for bit (float64 holds
    the float32 difference's correct rounding).
    """
    d = p - t
    return d * d, 2.0 * d


_ce_row_cpu = cpu_scalar(ce_row)
_ce_row_gpu = gpu_scalar(ce_row)
_sq_diff_cpu = cpu_scalar(sq_diff)
_sq_diff_gpu = gpu_scalar(sq_diff)

# ---------------------------------------------------------------- CUDA


@gpu_kernel
def _ce_kernel(logits, labels, weights, has_weights, grad, row_loss, row_weight, bad):
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    c = logits.shape[1]
    while i < logits.shape[0]:
        y = labels[i]
        if y < 0 or y >= c:
            bad[0] = 1
            row_loss[i] = 0.0
            row_weight[i] = 0.0
            for j in range(c):
                grad[i, j] = 0.0
        else:
            w = float64(weights[y]) if has_weights else 1.0  # float64, as on a GPU
            row_loss[i] = _ce_row_gpu(logits, grad, i, y, w, False)
            row_weight[i] = w
        i += stride


@gpu_kernel
def _mse_kernel(pred, target, grad, partial):
    acc = cuda.shared.array(BLOCK, float64)
    tid = cuda.threadIdx.x
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    s = 0.0
    while i < pred.size:
        sq, g = _sq_diff_gpu(float64(pred[i]), float64(target[i]))
        grad[i] = g
        s += sq
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


def softmax_cross_entropy_cuda(
    logits: Any, labels: Any, weights: Any | None, grad: Any
) -> tuple[float, float, bool]:
    """Fused CE on device arrays; returns (loss_sum, weight_sum, labels_ok)."""
    n = logits.shape[0]
    if n == 0:
        return 0.0, 0.0, True
    row_loss = cuda.device_array(n, dtype=np.float64)
    row_weight = cuda.device_array(n, dtype=np.float64)
    bad = cuda.to_device(np.zeros(1, dtype=np.int32))
    w = weights if weights is not None else cuda.to_device(np.ones(1, dtype=np.float32))
    launch_1d(
        _ce_kernel, n, logits, labels, w, weights is not None, grad, row_loss, row_weight, bad
    )
    with launch_lock():
        ok = int(bad.copy_to_host()[0]) == 0
        loss = float(row_loss.copy_to_host().sum())
        wsum = float(row_weight.copy_to_host().sum())
    return loss, wsum, ok


def mse_cuda(pred: Any, target: Any, grad: Any) -> float:
    """Fused MSE on flat device arrays; returns loss_sum (float64 block sums added on host)."""
    n = pred.size
    if n == 0:
        return 0.0
    partial = cuda.device_array(blocks_for(n), dtype=np.float64)
    launch_1d(_mse_kernel, n, pred, target, grad, partial)
    with launch_lock():
        return float(partial.copy_to_host().sum())


# ---------------------------------------------------------------- CPU twins


@cpu_math_loop
def softmax_cross_entropy_cpu(logits, labels, weights, has_weights, grad, approx):
    """Fused CE on arrays; returns (loss_sum, weight_sum, first_bad_row or -1).

    ``approx``: the vectorisable float32 exp (pass it for float32 buffers).
    """
    c = logits.shape[1]
    loss = 0.0
    wsum = 0.0
    for i in range(logits.shape[0]):
        y = labels[i]
        if y < 0 or y >= c:
            return loss, wsum, i
        w = weights[y] if has_weights else 1.0
        loss += _ce_row_cpu(logits, grad, i, y, w, approx)
        wsum += w
    return loss, wsum, -1


@cpu_reduce_loop
def mse_cpu(pred, target, grad):
    """Fused MSE on flat arrays; returns loss_sum (float64 accumulation)."""
    s = 0.0
    for i in range(pred.size):
        sq, g = _sq_diff_cpu(np.float64(pred[i]), np.float64(target[i]))
        grad[i] = g
        s += sq
    return s
