"""Vectorisable float32 ``exp`` and ``tanh`` for the CPU twins, and the
per-target primitives the scalar math calls (``fexp``, ``ftanh``, ``like``).

numba lowers ``math.exp`` / ``math.tanh`` to scalar libm calls (there is no
vector math library without SVML), so a loop calling them runs one element
at a time while NumPy 2.x uses SIMD ``exp``/``tanh``. These functions are
pure float32 multiply/add/divide plus one float -> int bit trick, which
LLVM vectorises. They are used when the scalar math is called with
``approx=True`` (the CPU twins on float32 buffers); float64 buffers and the
CUDA kernels use ``math.exp`` / ``math.tanh``.

Every constant is a float32 global: a float64 literal would promote the whole
expression to float64 (half the SIMD width, plus conversions).

Accuracy (checked against float64 over [-100, 100], see
docs/benchmarks.md): ``exp_f32`` within 2 ulp on [-87, 88] (clamped outside
that range: ``exp_f32(-1000)`` is ~1.7e-38, not 0, and ``exp_f32(1000)`` is
~1.7e38, not inf); ``tanh_f32`` within 3e-7 absolute and 5 ulp
(Eigen's float32 tanh), exactly +-1 past |x| = 9.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import types
from numba.extending import overload, register_jitable

__all__ = ["exp_f32", "fexp", "ftanh", "like", "tanh_f32"]

_F = np.float32

_EXP_LO = _F(-87.0)
_EXP_HI = _F(88.0)
_LOG2E = _F(1.44269504088896341)
_HALF = _F(0.5)
_ONE = _F(1.0)
_LN2_HI = _F(0.693359375)  # few mantissa bits: n * _LN2_HI is exact
_LN2_LO = _F(-2.12194440e-4)
# Cephes expf minimax polynomial for exp(r) - 1 - r on [-ln2/2, ln2/2]
_P0 = _F(1.9875691500e-4)
_P1 = _F(1.3981999507e-3)
_P2 = _F(8.3334519073e-3)
_P3 = _F(4.1665795894e-2)
_P4 = _F(1.6666665459e-1)
_P5 = _F(5.0000001201e-1)
_BIAS = np.int32(127)
_SHIFT = np.int32(23)


@register_jitable
def exp_f32(x: Any) -> Any:
    """exp(x) in float32 arithmetic; x is clamped to [-87, 88] (see module doc)."""
    x = _F(x)
    x = min(max(x, _EXP_LO), _EXP_HI)
    n = np.floor(x * _LOG2E + _HALF)
    r = x - n * _LN2_HI
    r = r - n * _LN2_LO
    p = _P0 * r + _P1
    p = p * r + _P2
    p = p * r + _P3
    p = p * r + _P4
    p = p * r + _P5
    p = p * (r * r) + r + _ONE
    scale = np.int32((np.int32(n) + _BIAS) << _SHIFT).view(np.float32)
    return p * scale


_TANH_CLAMP = _F(7.90531110763549805)
_A13 = _F(-2.76076847742355e-16)
_A11 = _F(2.00018790482477e-13)
_A9 = _F(-8.60467152213735e-11)
_A7 = _F(5.12229709037114e-08)
_A5 = _F(1.48572235717979e-05)
_A3 = _F(6.37261928875436e-04)
_A1 = _F(4.89352455891786e-03)
_B6 = _F(1.19825839466702e-06)
_B4 = _F(1.18534705686654e-04)
_B2 = _F(2.26843463243900e-03)
_B0 = _F(4.89352518554385e-03)


_TANH_ONE = _F(9.0)  # tanh(x) rounds to +-1 in float32 for |x| > 9.01


@register_jitable
def tanh_f32(x: Any) -> Any:
    """tanh(x) as Eigen's clamped 13/6 rational polynomial, in float32 arithmetic.

    Exactly +-1 for |x| >= 9 (the clamped polynomial alone tops out at
    0.99999976); NaN stays NaN.
    """
    x = _F(x)
    ax = x if x >= _F(0.0) else -x
    if ax >= _TANH_ONE:
        return _ONE if x > _F(0.0) else -_ONE
    x = min(max(x, -_TANH_CLAMP), _TANH_CLAMP)
    x2 = x * x
    p = x2 * _A13 + _A11
    p = x2 * p + _A9
    p = x2 * p + _A7
    p = x2 * p + _A5
    p = x2 * p + _A3
    p = x2 * p + _A1
    q = x2 * _B6 + _B4
    q = x2 * q + _B2
    q = x2 * q + _B0
    return x * p / q


# ------------------------------------------------- primitives of the scalar math


def like(x: float, value: float) -> float:
    """``value`` as a scalar of x's float type (a float64 literal would promote float32 math).

    In plain Python (the CUDA simulator) it returns ``value`` unchanged.
    """
    return value


@overload(like)
def _like_jit(x, value):
    if isinstance(x, types.Float):
        ty = x
        return lambda x, value: ty(value)
    return lambda x, value: value


def fexp(x: float, approx: bool) -> float:
    """exp(x): ``exp_f32`` on the CPU when ``approx``, else ``math.exp`` (always on CUDA)."""
    return math.exp(x)


@overload(fexp, target="cpu")
def _fexp_cpu(x, approx):
    return lambda x, approx: exp_f32(x) if approx else math.exp(x)


@overload(fexp, target="cuda")
def _fexp_cuda(x, approx):
    return lambda x, approx: math.exp(x)


def ftanh(x: float, approx: bool) -> float:
    """tanh(x): ``tanh_f32`` on the CPU when ``approx``, else ``math.tanh`` (always on CUDA)."""
    return math.tanh(x)


@overload(ftanh, target="cpu")
def _ftanh_cpu(x, approx):
    return lambda x, approx: tanh_f32(x) if approx else math.tanh(x)


@overload(ftanh, target="cuda")
def _ftanh_cuda(x, approx):
    return lambda x, approx: math.tanh(x)
