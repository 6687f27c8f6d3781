"""Element-wise kernels: activations (forward and backward), bias add, axpy, scale.

Layout (micrograd style): the scalar math first, written once as plain
Python; then the CUDA kernels and their launchers; then the CPU twins
(njit loops, GIL released). Launchers and twins take *flat* (1-D) views,
except ``bias_add_*`` which takes the 2-D matrix; validation is the
backend's job.

Activation codes: 0 identity, 1 relu, 2 tanh, 3 gelu (tanh approximation,
as torch's ``gelu(approximate='tanh')``).
"""

from __future__ import annotations

import math
from typing import Any

from numba.extending import register_jitable

from atomr.accel.kernels._compile import (
    cpu_loop,
    cpu_scalar,
    cuda,
    gpu_kernel,
    gpu_scalar,
    launch_1d,
    launch_2d,
)

__all__ = [
    "ACTIVATIONS",
    "activation_backward_cpu",
    "activation_backward_cuda",
    "activation_forward_cpu",
    "activation_forward_cuda",
    "axpy_cpu",
    "axpy_cuda",
    "bias_add_cpu",
    "bias_add_cuda",
    "scale_cpu",
    "scale_cuda",
]

ACTIVATIONS: dict[str, int] = {"identity": 0, "relu": 1, "tanh": 2, "gelu": 3}
"""Activation name -> the code the kernels take."""

# ---------------------------------------------------------------- scalar math

_GELU_K = math.sqrt(2.0 / math.pi)
_GELU_C = 0.044715


@register_jitable
def tanh_rational(x: float) -> float:
    """tanh(x) as a clamped 13/6 rational polynomial (Eigen's float32 tanh; ~1e-7 abs error).

    Pure multiply/add/divide, so LLVM vectorises the CPU loops (a libm tanh call
    would not be); used by the CPU twins for float32 only.
    """
    x = min(max(x, -7.90531110763549805), 7.90531110763549805)
    x2 = x * x
    p = x2 * -2.76076847742355e-16 + 2.00018790482477e-13
    p = x2 * p + -8.60467152213735e-11
    p = x2 * p + 5.12229709037114e-08
    p = x2 * p + 1.48572235717979e-05
    p = x2 * p + 6.37261928875436e-04
    p = x2 * p + 4.89352455891786e-03
    q = x2 * 1.19825839466702e-06 + 1.18534705686654e-04
    q = x2 * q + 2.26843463243900e-03
    q = x2 * q + 4.89352518554385e-03
    return x * p / q


def act_forward(kind: int, x: float, approx: bool) -> float:
    """f(x) for activation ``kind`` (see ACTIVATIONS); ``approx``: rational tanh."""
    if kind == 1:
        return x if x > 0.0 else 0.0
    if kind == 2:
        return tanh_rational(x) if approx else math.tanh(x)
    if kind == 3:
        # Exact tanh even when ``approx``: 1 + t cancels for very negative x, and
        # the rational tanh's ~1e-6 error there would be scaled by x.
        u = _GELU_K * (x + _GELU_C * x * x * x)
        return 0.5 * x * (1.0 + math.tanh(u))
    return x


def act_backward(kind: int, x: float, dy: float, approx: bool) -> float:
    """dy * f'(x) for activation ``kind``, x the pre-activation; ``approx``: rational tanh."""
    if kind == 1:
        return dy if x > 0.0 else 0.0
    if kind == 2:
        t = tanh_rational(x) if approx else math.tanh(x)
        return dy * (1.0 - t * t)
    if kind == 3:
        u = _GELU_K * (x + _GELU_C * x * x * x)
        t = tanh_rational(u) if approx else math.tanh(u)
        dt = (1.0 - t * t) * _GELU_K * (1.0 + 3.0 * _GELU_C * x * x)
        return dy * (0.5 * (1.0 + t) + 0.5 * x * dt)
    return dy


_act_forward_cpu = cpu_scalar(act_forward)
_act_backward_cpu = cpu_scalar(act_backward)
_act_forward_gpu = gpu_scalar(act_forward)
_act_backward_gpu = gpu_scalar(act_backward)

# ---------------------------------------------------------------- CUDA


@gpu_kernel
def _act_forward_kernel(kind, x, out):
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < x.size:
        out[i] = _act_forward_gpu(kind, x[i], False)
        i += stride


@gpu_kernel
def _act_backward_kernel(kind, x, dy, dx):
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < x.size:
        dx[i] = _act_backward_gpu(kind, x[i], dy[i], False)
        i += stride


@gpu_kernel
def _axpy_kernel(alpha, x, y):
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < x.size:
        y[i] += alpha * x[i]
        i += stride


@gpu_kernel
def _scale_kernel(x, alpha):
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < x.size:
        x[i] *= alpha
        i += stride


@gpu_kernel
def _bias_add_kernel(x, bias):
    c = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    r = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
    if r < x.shape[0] and c < x.shape[1]:
        x[r, c] += bias[c]


def activation_forward_cuda(kind: int, x: Any, out: Any) -> None:
    """out = f(x) on flat device arrays."""
    launch_1d(_act_forward_kernel, x.size, kind, x, out)


def activation_backward_cuda(kind: int, x: Any, dy: Any, dx: Any) -> None:
    """dx = dy * f'(x) on flat device arrays."""
    launch_1d(_act_backward_kernel, x.size, kind, x, dy, dx)


def axpy_cuda(alpha: float, x: Any, y: Any) -> None:
    """y += alpha * x on flat device arrays."""
    launch_1d(_axpy_kernel, x.size, alpha, x, y)


def scale_cuda(x: Any, alpha: float) -> None:
    """x *= alpha on a flat device array."""
    launch_1d(_scale_kernel, x.size, x, alpha)


def bias_add_cuda(x: Any, bias: Any) -> None:
    """x[i, :] += bias on a 2-D device array."""
    launch_2d(_bias_add_kernel, x.shape[0], x.shape[1], x, bias)


# ---------------------------------------------------------------- CPU twins


@cpu_loop
def activation_forward_cpu(kind, x, out, approx):
    """out = f(x) on flat arrays; ``approx``: the vectorisable rational tanh (float32)."""
    for i in range(x.size):
        out[i] = _act_forward_cpu(kind, x[i], approx)


@cpu_loop
def activation_backward_cpu(kind, x, dy, dx, approx):
    """dx = dy * f'(x) on flat arrays; ``approx``: the vectorisable rational tanh (float32)."""
    for i in range(x.size):
        dx[i] = _act_backward_cpu(kind, x[i], dy[i], approx)


@cpu_loop
def axpy_cpu(alpha, x, y):
    """y += alpha * x on flat arrays (pass alpha as a scalar of y's dtype)."""
    for i in range(x.size):
        y[i] += alpha * x[i]


@cpu_loop
def scale_cpu(x, alpha):
    """x *= alpha on a flat array (pass alpha as a scalar of x's dtype)."""
    for i in range(x.size):
        x[i] *= alpha


@cpu_loop
def bias_add_cpu(x, bias):
    """x[i, :] += bias on a 2-D array."""
    for r in range(x.shape[0]):
        for c in range(x.shape[1]):
            x[r, c] += bias[c]
