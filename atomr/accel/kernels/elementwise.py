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

from atomr.accel.kernels._compile import (
    cpu_loop,
    cpu_math_loop,
    cpu_scalar,
    cuda,
    gpu_kernel,
    gpu_scalar,
    launch_1d,
    launch_2d,
)
from atomr.accel.kernels._fastmath import fexp, ftanh, like

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
_GELU_X_MIN = -9.5
_GELU_X_MAX = 9.5
"""GELU's input is clamped to ``[_GELU_X_MIN, _GELU_X_MAX]``, where both tails
have saturated: gelu(-9.5) ~ -7e-33 and its slope ~ -1.4e-31, 0 for training;
past 9.5, gelu(x) = x and gelu'(x) = 1 to a relative 1e-31, far below float64's
precision. So the largest exponent is exp(+-76) ~ 1e33 and no power of x
overflows: the forward, ``x / (1 + exp(-2u))``, takes u from the clamped x and
keeps x itself on the right (it is x there, up to 3e38 and inf); the backward
clamps x on both sides.

Unclamped on the left, x / (1 + e) grew linearly (-5e3 at x = -3e38) and
x * e reached -inf from x ~ -3e3; on the right, x^2 overflowed, giving
x * 0 * inf = NaN in the backward (float32 from x ~ 1.8e19, float64 from
~1e154) and, with the float32 approximate exp (never below 1.7e-38), slopes of
4.5 at x = 1e13 and inf from 2e19. The clamp also keeps Python's math.exp in
the CUDA simulator far from its OverflowError near 710. NaN passes the clamp
(`lo if x < lo else x`)."""


def act_forward(kind: int, x: float, approx: bool) -> float:
    """f(x) for activation ``kind`` (see ACTIVATIONS).

    ``approx``: the vectorisable float32 tanh / exp of ``_fastmath`` (CPU,
    float32 buffers); every constant is ``like(x, ...)`` so float32 stays
    float32. GELU is evaluated as ``x * sigmoid(2u) = x / (1 + exp(-2u))``,
    which equals ``0.5 x (1 + tanh(u))`` without the cancellation of ``1 + tanh``
    for very negative x; x is clamped below at ``_GELU_X_MIN``, where it is ~0
    (torch's is 0 there), and u is taken from x clamped above at
    ``_GELU_X_MAX``, where the result is x.
    """
    zero = like(x, 0.0)
    if kind == 1:
        return zero if x <= zero else x  # NaN stays NaN, as np.maximum / torch.relu
    if kind == 2:
        return ftanh(x, approx)
    if kind == 3:
        one = like(x, 1.0)
        lo = like(x, _GELU_X_MIN)
        hi = like(x, _GELU_X_MAX)
        x = lo if x < lo else x
        t = hi if x > hi else x
        u = like(x, _GELU_K) * (t + like(x, _GELU_C) * t * t * t)
        return x / (one + fexp(like(x, -2.0) * u, approx))
    return x


def act_backward(kind: int, x: float, dy: float, approx: bool) -> float:
    """dy * f'(x) for activation ``kind``, x the pre-activation.

    tanh: ``1 - tanh(x)^2 = 4e / (1 + e)^2`` with ``e = exp(-2|x|)``, free of the
    cancellation of ``1 - t^2`` (so the approximate exp is accurate here too).
    GELU: with ``e = exp(-2u)``, ``s = 1 / (1 + e)`` (= ``(1 + tanh u) / 2``),
    ``f'(x) = s (1 + 2 x e s u')``, ``u' = k (1 + 3 c x^2)``, x clamped to
    ``[_GELU_X_MIN, _GELU_X_MAX]`` (f' is ~0 below, 1 above).
    """
    zero = like(x, 0.0)
    one = like(x, 1.0)
    if kind == 1:
        return dy if x > zero else zero
    if kind == 2:
        ax = x if x >= zero else -x
        e = fexp(like(x, -2.0) * ax, approx)
        d = one + e
        return dy * (like(x, 4.0) * e / (d * d))
    if kind == 3:
        k = like(x, _GELU_K)
        c = like(x, _GELU_C)
        lo = like(x, _GELU_X_MIN)
        hi = like(x, _GELU_X_MAX)
        x = lo if x < lo else (hi if x > hi else x)
        x2 = x * x
        u = k * (x + c * x2 * x)
        e = fexp(like(x, -2.0) * u, approx)
        s = one / (one + e)
        du = k * (one + like(x, 3.0) * c * x2)
        return dy * (s * (one + like(x, 2.0) * x * e * s * du))
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
    if c < x.shape[1]:
        while r < x.shape[0]:  # row-stride: the grid has at most MAX_GRID_Y row blocks
            x[r, c] += bias[c]
            r += cuda.gridDim.y * cuda.blockDim.y


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


@cpu_scalar
def _fwd_loop(kind, x, out, approx):
    for i in range(x.size):
        out[i] = _act_forward_cpu(kind, x[i], approx)


@cpu_scalar
def _bwd_loop(kind, x, dy, dx, approx):
    for i in range(x.size):
        dx[i] = _act_backward_cpu(kind, x[i], dy[i], approx)


@cpu_math_loop
def activation_forward_cpu(kind, x, out, approx):
    """out = f(x) on flat arrays; ``approx``: the vectorisable float32 tanh / exp.

    One loop per (kind, approx) with both as constants, so each loop is
    straight-line math that LLVM vectorises.
    """
    if kind == 1:
        _fwd_loop(1, x, out, False)
    elif kind == 2:
        if approx:
            _fwd_loop(2, x, out, True)
        else:
            _fwd_loop(2, x, out, False)
    elif kind == 3:
        if approx:
            _fwd_loop(3, x, out, True)
        else:
            _fwd_loop(3, x, out, False)
    else:
        _fwd_loop(0, x, out, False)


@cpu_math_loop
def activation_backward_cpu(kind, x, dy, dx, approx):
    """dx = dy * f'(x) on flat arrays; ``approx``: the vectorisable float32 exp."""
    if kind == 1:
        _bwd_loop(1, x, dy, dx, False)
    elif kind == 2:
        if approx:
            _bwd_loop(2, x, dy, dx, True)
        else:
            _bwd_loop(2, x, dy, dx, False)
    elif kind == 3:
        if approx:
            _bwd_loop(3, x, dy, dx, True)
        else:
            _bwd_loop(3, x, dy, dx, False)
    else:
        _bwd_loop(0, x, dy, dx, False)


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
