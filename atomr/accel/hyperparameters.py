"""The optimizer kernels' hyperparameters: validated once, when built, and
once more for the dtype they are used in, when that is known.

`SgdHyperparameters` and `AdamHyperparameters` are the one place that names
the arguments of the fused `sgd_step` / `adam_step` kernels. Each is checked
when it is built for what is wrong in every dtype (a wrong type, NaN, a
negative rate, a value or coefficient out of float64's range), and by
`check_dtype(dtype)` for the dtype of the buffers it updates: a value such as
`lr=1e39`, finite in float64 but infinite in float32, is refused for float32
buffers (the optimizer state calls it when it is built, the checked backend
entries on every call) and never reaches a kernel. A step then only asks the
object for `kernel_args(step, dtype)`, the scalars its kernel takes in the
buffers' dtype, with no check.
"""

from __future__ import annotations

import math
import reprlib
from dataclasses import dataclass
from numbers import Real
from typing import Any

import numpy as np

from atomr._arguments import bool_flag, real_as_float

__all__ = [
    "AdamHyperparameters",
    "SgdHyperparameters",
    "finite_in",
    "given_in",
    "given_in_float32",
]


def given_in_float32(name: str, value: Any) -> float:
    """A hyperparameter as a user gives it: `given_in` float32 (the
    narrowest dtype the kernels compute in).

    Raises:
        TypeError: not a real number (a bool included).
        ValueError: NaN, infinite in float32, or non-zero but 0 in float32.
    """
    return given_in(name, value, _FLOAT32)


def given_in(name: str, value: Any, dtype: Any) -> float:
    """A hyperparameter as a user gives it, for kernels computing in `dtype`
    (float32 or float64): a real number, finite in `dtype`, and not so small
    that it rounds to 0 there (`lr=1e-50` would silently train nothing in
    float32). A schedule may still decay a rate to 0; this is for given values.

    Raises:
        TypeError: not a real number (a bool included).
        ValueError: NaN, infinite in `dtype`, or non-zero but 0 in `dtype`
            (`Fraction(1, 10**400)`, which `float()` makes 0.0, included).
    """
    dt = np.dtype(dtype)
    v = _real_finite_in(name, value, dt)
    if dt.type(v) == 0.0 and (v != 0.0 or value != 0):
        shown = v if v != 0.0 else reprlib.repr(value)
        least = float(np.finfo(dt).smallest_subnormal)
        raise ValueError(f"{name}={shown} rounds to 0 in {dt}; give 0 or a value >= {least:.0e}")
    return v


def _real_finite_in(name: str, value: Any, dtype: np.dtype[Any]) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    v = real_as_float(value)
    if not finite_in(v, dtype):
        shown = reprlib.repr(value) if isinstance(value, int) else v
        raise ValueError(f"{name} must be finite in {dtype}, got {shown}")
    return v


# |v| from which a float64 rounds to infinity in float32: halfway between
# float32's largest value and 2**128 (a tie rounds to the even 2**128)
_FLOAT32_OVERFLOW = (2.0 - 2.0**-24) * 2.0**127
_FLOAT32 = np.dtype(np.float32)
_FLOAT64 = np.dtype(np.float64)

# a step from which 1 - beta**step is exactly 1.0 for every float64 beta < 1
# ((1 - 2**-53) ** 2**60 = exp(-128) < 2**-53): Adam's bias corrections are
# the same past it, and a step beyond float's range (10**400) is not converted
_BIAS_CORRECTION_DONE = 2**60


def finite_in(v: float, dtype: np.dtype[Any]) -> bool:
    """Whether the float `v` is finite once cast to `dtype` (float32 or
    float64): a compare, not a cast (checked entries run it per call)."""
    return math.isfinite(v) and (dtype.itemsize >= 8 or abs(v) < _FLOAT32_OVERFLOW)


def _finite_values_in(dtype: Any, values: dict[str, float]) -> None:
    """Raises: ValueError: a value (a coefficient named by what it is, or a
    hyperparameter) infinite in `dtype`, naming it, its value and `dtype`."""
    dt = np.dtype(dtype)
    for what, value in values.items():
        if not finite_in(value, dt):
            raise ValueError(f"{what} must be finite in {dt}, got {value}")


def _at_least_zero(**values: float) -> None:
    bad = {k: v for k, v in values.items() if not v >= 0.0}
    if bad:
        shown = ", ".join(f"{k}={v}" for k, v in bad.items())
        raise ValueError(f"{', '.join(bad)} must be >= 0, got {shown}")


@dataclass(frozen=True)
class SgdHyperparameters:
    """torch.optim.SGD's hyperparameters, as the `sgd_step` kernel takes them.

    Attributes:
        lr: learning rate, >= 0.
        momentum: momentum factor, >= 0.
        dampening: dampening of the momentum.
        weight_decay: L2 penalty, >= 0.
        nesterov: Nesterov momentum (needs momentum > 0 and dampening == 0).

    Raises:
        TypeError: a value that is not a real number (`nesterov`: not a bool).
        ValueError: a value that is NaN or infinite in float64, a negative
            lr, momentum or weight_decay, or nesterov without momentum or
            with dampening. (Infinite in float32: `check_dtype`.)
    """

    lr: float
    momentum: float = 0.0
    dampening: float = 0.0
    weight_decay: float = 0.0
    nesterov: bool = False

    def __post_init__(self) -> None:
        for name in ("lr", "momentum", "dampening", "weight_decay"):
            object.__setattr__(self, name, _real_finite_in(name, getattr(self, name), _FLOAT64))
        object.__setattr__(self, "nesterov", bool_flag("nesterov", self.nesterov))
        _at_least_zero(lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay)
        if self.nesterov and (self.momentum <= 0.0 or self.dampening != 0.0):
            raise ValueError("nesterov momentum requires momentum > 0 and dampening == 0")
        # `kernel_args`' scalars by dtype: the values are frozen, made once per dtype
        object.__setattr__(self, "_scalars", {})

    def check_dtype(self, dtype: Any) -> None:
        """Check that the kernel can compute with these values in `dtype`
        (float32 or float64, the buffers'): each finite there.

        Raises:
            ValueError: a value infinite in `dtype` (named, with its value).
        """
        names = ("lr", "momentum", "dampening", "weight_decay")
        _finite_values_in(dtype, {name: getattr(self, name) for name in names})

    def kernel_args(self, step: int, dtype: Any) -> tuple[Any, ...]:
        """The kernel's scalars for 1-based step `step`, in `dtype` (the
        buffers'): `(lr, momentum, 1 - dampening, weight_decay, nesterov,
        first)`, `first` being torch's first-step rule (`buf = grad`). In the
        buffers' dtype, float32 buffers are updated in float32 math (as torch
        does), and the CPU loop vectorises twice as wide."""
        by_dtype = self.__dict__["_scalars"]
        scalars = by_dtype.get(dtype)
        if scalars is None:
            t = np.dtype(dtype).type
            scalars = (t(self.lr), t(self.momentum), t(1.0 - self.dampening), t(self.weight_decay))
            by_dtype[dtype] = scalars
        return (*scalars, self.nesterov, step == 1)


@dataclass(frozen=True)
class AdamHyperparameters:
    """torch.optim.Adam's (or, `decoupled`, AdamW's) hyperparameters, as the
    `adam_step` kernel takes them.

    Attributes:
        lr: learning rate, >= 0.
        beta1, beta2: the moments' decay rates, in [0, 1).
        eps: added to the denominator, >= 0.
        weight_decay: >= 0; an L2 penalty (Adam) or decoupled decay (AdamW).
        decoupled: AdamW's decoupled weight decay instead of Adam's L2.

    Raises:
        TypeError: a value that is not a real number (`decoupled`: not a bool).
        ValueError: a value that is NaN or infinite in float64, betas outside
            [0, 1), a negative lr, eps or weight_decay, or a bias-corrected
            step size (`lr / (1 - beta1)`, `1 / sqrt(1 - beta2)`) or AdamW
            decay factor (`1 - lr * weight_decay`) infinite in float64.
            (Infinite in float32: `check_dtype`.)
    """

    lr: float
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    decoupled: bool = False

    def __post_init__(self) -> None:
        for name in ("lr", "beta1", "beta2", "eps", "weight_decay"):
            object.__setattr__(self, name, _real_finite_in(name, getattr(self, name), _FLOAT64))
        object.__setattr__(self, "decoupled", bool_flag("decoupled", self.decoupled))
        if not (0.0 <= self.beta1 < 1.0 and 0.0 <= self.beta2 < 1.0):
            raise ValueError(f"betas must be in [0, 1), got ({self.beta1}, {self.beta2})")
        _at_least_zero(lr=self.lr, eps=self.eps, weight_decay=self.weight_decay)
        self.check_dtype(_FLOAT64)

    def check_dtype(self, dtype: Any) -> None:
        """Check that the kernel can compute with these values in `dtype`
        (float32 or float64, the buffers'): each finite there, and the
        largest values its coefficients take (step 1) too.

        Raises:
            ValueError: a value, a bias-corrected step size (`lr / (1 -
                beta1)`, `1 / sqrt(1 - beta2)`) or the AdamW decay factor
                (`1 - lr * weight_decay`) infinite in `dtype` (named, with
                its value).
        """
        names = ("lr", "beta1", "beta2", "eps", "weight_decay")
        _finite_values_in(dtype, {name: getattr(self, name) for name in names})
        _finite_values_in(
            dtype,
            {
                "the first step size lr / (1 - beta1)": self.lr / (1.0 - self.beta1),
                "1 / sqrt(1 - beta2)": 1.0 / math.sqrt(1.0 - self.beta2),
                "the decay factor 1 - lr * weight_decay": 1.0 - self.lr * self.weight_decay,
            },
        )

    def kernel_args(self, step: int, dtype: Any) -> tuple[Any, ...]:
        """The kernel's scalars for 1-based step `step`, in `dtype` (the
        buffers'): `(beta1, 1 - beta1, beta2, 1 - beta2, l2, decay, step_size,
        1 / sqrt(1 - beta2^t), eps)`, where Adam has `l2 = weight_decay,
        decay = 1` and AdamW `l2 = 0, decay = 1 - lr * weight_decay`."""
        t = np.dtype(dtype).type
        beta1, beta2, lr, wd = self.beta1, self.beta2, self.lr, self.weight_decay
        step = min(step, _BIAS_CORRECTION_DONE)  # 10**400 overflowed float()
        step_size = lr / (1.0 - beta1**step)
        inv_bc2_sqrt = 1.0 / math.sqrt(1.0 - beta2**step)
        l2, decay = (0.0, 1.0 - lr * wd) if self.decoupled else (wd, 1.0)
        return (
            t(beta1),
            t(1.0 - beta1),
            t(beta2),
            t(1.0 - beta2),
            t(l2),
            t(decay),
            t(step_size),
            t(inv_bc2_sqrt),
            t(self.eps),
        )
