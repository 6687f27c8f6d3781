"""LayerNorm over the last axis: forward, input gradient, parameter gradients.

Each row is normalised on its own (`y = (x - mean) * rstd * gamma + beta`,
`rstd = 1 / sqrt(var + eps)`, the biased variance, as torch's `LayerNorm`),
so the forward and the input gradient are *row* functions written once:
the CPU twin loops over the rows, the CUDA kernel gives each thread rows
(grid-stride). A row's mean and rstd are kept for the backward pass. The
parameter gradients sum over the rows, so they are *column* functions (a
thread per column), which needs no atomics. Sums accumulate in float64:
each float32 term is cast with ``float64(...)``, which compiled code does
anyway (a float32 plus a float64 is a float64) and which keeps the CUDA
simulator from adding in float32 (NumPy 2 keeps a float32 scalar plus a
Python float in float32), so that the simulator computes what a GPU does.

    xhat = (x - mean) * rstd          dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  g = dy * gamma
    dgamma = sum_rows(dy * xhat)      dbeta = sum_rows(dy)
"""

from __future__ import annotations

import math
from typing import Any

from numba import float64

from atomr.accel.kernels._compile import (
    cpu_loop,
    cpu_scalar,
    cuda,
    gpu_kernel,
    gpu_scalar,
    launch_1d,
)

__all__ = [
    "layernorm_backward_cpu",
    "layernorm_backward_cuda",
    "layernorm_forward_cpu",
    "layernorm_forward_cuda",
    "layernorm_params_grad_cpu",
    "layernorm_params_grad_cuda",
]


def _forward_row(x, gamma, beta, y, mean, rstd, eps, r):
    d = x.shape[1]
    s = 0.0
    for j in range(d):
        s += float64(x[r, j])
    m = s / d
    v = 0.0
    for j in range(d):
        t = float64(x[r, j]) - m
        v += t * t
    inv = 1.0 / math.sqrt(v / d + eps)
    mean[r] = m
    rstd[r] = inv
    for j in range(d):
        y[r, j] = (float64(x[r, j]) - m) * inv * gamma[j] + beta[j]


def _backward_row(x, gamma, mean, rstd, dy, dx, r):
    d = x.shape[1]
    m = mean[r]
    inv = rstd[r]
    sg = 0.0
    sgx = 0.0
    for j in range(d):
        g = dy[r, j] * gamma[j]  # float32 products, as on a GPU; float64 sums
        sg += float64(g)
        sgx += float64(g * (x[r, j] - m) * inv)
    sg /= d
    sgx /= d
    for j in range(d):
        xhat = (x[r, j] - m) * inv
        dx[r, j] = inv * (dy[r, j] * gamma[j] - sg - xhat * sgx)


def _params_column(x, mean, rstd, dy, dgamma, dbeta, accumulate, j):
    sg = 0.0
    sb = 0.0
    for r in range(x.shape[0]):
        sg += float64(dy[r, j] * (x[r, j] - mean[r]) * rstd[r])
        sb += float64(dy[r, j])
    if accumulate:
        dgamma[j] += sg
        dbeta[j] += sb
    else:
        dgamma[j] = sg
        dbeta[j] = sb


_forward_cpu = cpu_scalar(_forward_row)
_backward_cpu = cpu_scalar(_backward_row)
_params_cpu = cpu_scalar(_params_column)
_forward_gpu = gpu_scalar(_forward_row)
_backward_gpu = gpu_scalar(_backward_row)
_params_gpu = gpu_scalar(_params_column)


@cpu_loop
def layernorm_forward_cpu(x, gamma, beta, y, mean, rstd, eps):
    """y = LayerNorm(x) over the last axis of the 2-D `x`; keeps each row's mean and rstd."""
    for r in range(x.shape[0]):
        _forward_cpu(x, gamma, beta, y, mean, rstd, eps, r)


@cpu_loop
def layernorm_backward_cpu(x, gamma, mean, rstd, dy, dx):
    """dx of LayerNorm (overwritten) from the forward's mean and rstd."""
    for r in range(x.shape[0]):
        _backward_cpu(x, gamma, mean, rstd, dy, dx, r)


@cpu_loop
def layernorm_params_grad_cpu(x, mean, rstd, dy, dgamma, dbeta, accumulate):
    """dgamma and dbeta (written, or added with `accumulate`)."""
    for j in range(x.shape[1]):
        _params_cpu(x, mean, rstd, dy, dgamma, dbeta, accumulate, j)


@gpu_kernel
def _forward_kernel(x, gamma, beta, y, mean, rstd, eps):
    r = cuda.grid(1)
    while r < x.shape[0]:
        _forward_gpu(x, gamma, beta, y, mean, rstd, eps, r)
        r += cuda.gridsize(1)


@gpu_kernel
def _backward_kernel(x, gamma, mean, rstd, dy, dx):
    r = cuda.grid(1)
    while r < x.shape[0]:
        _backward_gpu(x, gamma, mean, rstd, dy, dx, r)
        r += cuda.gridsize(1)


@gpu_kernel
def _params_kernel(x, mean, rstd, dy, dgamma, dbeta, accumulate):
    j = cuda.grid(1)
    while j < x.shape[1]:
        _params_gpu(x, mean, rstd, dy, dgamma, dbeta, accumulate, j)
        j += cuda.gridsize(1)


def layernorm_forward_cuda(
    x: Any, gamma: Any, beta: Any, y: Any, mean: Any, rstd: Any, eps: float
) -> None:
    """The CUDA twin of `layernorm_forward_cpu` (a thread per row)."""
    launch_1d(_forward_kernel, x.shape[0], x, gamma, beta, y, mean, rstd, eps)


def layernorm_backward_cuda(x: Any, gamma: Any, mean: Any, rstd: Any, dy: Any, dx: Any) -> None:
    """The CUDA twin of `layernorm_backward_cpu` (a thread per row)."""
    launch_1d(_backward_kernel, x.shape[0], x, gamma, mean, rstd, dy, dx)


def layernorm_params_grad_cuda(
    x: Any, mean: Any, rstd: Any, dy: Any, dgamma: Any, dbeta: Any, accumulate: bool
) -> None:
    """The CUDA twin of `layernorm_params_grad_cpu` (a thread per column)."""
    launch_1d(_params_kernel, x.shape[1], x, mean, rstd, dy, dgamma, dbeta, accumulate)
