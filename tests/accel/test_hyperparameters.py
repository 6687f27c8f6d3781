"""`SgdHyperparameters` / `AdamHyperparameters`: validated in float64 when
built, and in the buffers' dtype by `check_dtype`."""

from __future__ import annotations

import dataclasses
import math
import pickle
from decimal import Decimal
from fractions import Fraction
from numbers import Real
from typing import Any

import numpy as np
import pytest

from atomr.accel import AdamHyperparameters, SgdHyperparameters
from atomr.accel.hyperparameters import finite_in, given_in

F32_MAX = float(np.finfo(np.float32).max)
F32, F64 = np.dtype(np.float32), np.dtype(np.float64)


def test_defaults_are_torchs() -> None:
    adam = AdamHyperparameters(1e-3)
    assert (adam.beta1, adam.beta2, adam.eps, adam.weight_decay, adam.decoupled) == (
        0.9,
        0.999,
        1e-8,
        0.0,
        False,
    )
    sgd = SgdHyperparameters(0.1)
    assert (sgd.momentum, sgd.dampening, sgd.weight_decay, sgd.nesterov) == (0.0, 0.0, 0.0, False)


@pytest.mark.parametrize("value", [math.inf, math.nan, 10**400, -(10**400)])
@pytest.mark.parametrize("name", ["lr", "beta1", "eps", "weight_decay"])
def test_adam_refuses_values_infinite_in_float64_when_built(name: str, value: float) -> None:
    """Wrong in every dtype: refused at once."""
    with pytest.raises(ValueError, match=f"{name} must be finite in float64"):
        AdamHyperparameters(**{"lr": 0.1, name: value})


@pytest.mark.parametrize("name", ["lr", "eps", "weight_decay"])  # betas are < 1
def test_adam_values_infinite_in_float32_only_are_refused_by_check_dtype(name: str) -> None:
    """1e39 is finite in float64 but not in float32: built, then refused for
    float32 buffers only, the message naming the value, it and the dtype."""
    h = AdamHyperparameters(**{"lr": 0.1, "beta1": 0.0, name: 1e39})
    h.check_dtype(F64)
    with pytest.raises(ValueError, match=f"{name} must be finite in float32, got 1e\\+39"):
        h.check_dtype(F32)


@pytest.mark.parametrize("name", ["lr", "momentum", "dampening", "weight_decay"])
def test_sgd_values_infinite_in_float32_only_are_refused_by_check_dtype(name: str) -> None:
    with pytest.raises(ValueError, match=f"{name} must be finite in float64"):
        SgdHyperparameters(**{"lr": 0.1, name: 1e309 if name != "lr" else math.inf})
    h = SgdHyperparameters(**{"lr": 0.1, name: 1e39})
    h.check_dtype(F64)
    with pytest.raises(ValueError, match=f"{name} must be finite in float32, got 1e\\+39"):
        h.check_dtype(F32)


def test_the_largest_finite_float32_is_accepted() -> None:
    SgdHyperparameters(F32_MAX).check_dtype(F32)
    AdamHyperparameters(1.0, beta1=0.0, eps=F32_MAX, weight_decay=0.0).check_dtype(F32)


def test_adam_refuses_coefficients_that_overflow_the_dtype() -> None:
    """lr itself fits, but the first step size lr / (1 - beta1) does not:
    in float32 by `check_dtype`, in float64 when built."""
    big_step = AdamHyperparameters(1e38, beta1=0.9)
    big_step.check_dtype(F64)
    with pytest.raises(ValueError, match="first step size .* must be finite in float32"):
        big_step.check_dtype(F32)
    big_decay = AdamHyperparameters(1e20, beta1=0.0, weight_decay=1e20, decoupled=True)
    with pytest.raises(ValueError, match="decay factor .* must be finite in float32"):
        big_decay.check_dtype(F32)
    with pytest.raises(ValueError, match="first step size .* must be finite in float64"):
        AdamHyperparameters(1e308, beta1=0.9)
    with pytest.raises(ValueError, match="decay factor .* must be finite in float64"):
        AdamHyperparameters(1e200, beta1=0.0, weight_decay=1e200, decoupled=True)


@pytest.mark.parametrize(("b1", "b2"), [(1.0, 0.9), (0.9, 1.0), (-0.1, 0.9), (0.9, 1.5)])
def test_betas_outside_unit_interval(b1: float, b2: float) -> None:
    with pytest.raises(ValueError, match=r"betas must be in \[0, 1\)"):
        AdamHyperparameters(0.1, b1, b2)


def test_negative_values_and_bad_types() -> None:
    with pytest.raises(ValueError, match="lr must be >= 0"):
        SgdHyperparameters(-0.1)
    with pytest.raises(ValueError, match="eps, weight_decay must be >= 0"):
        AdamHyperparameters(0.1, eps=-1.0, weight_decay=-1.0)
    with pytest.raises(TypeError, match="lr must be a real number"):
        SgdHyperparameters("0.1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="lr must be a real number"):
        AdamHyperparameters(True)
    with pytest.raises(TypeError, match="nesterov must be True or False"):
        SgdHyperparameters(0.1, momentum=0.9, nesterov=1)  # type: ignore[arg-type]


def test_nesterov_needs_momentum_and_no_dampening() -> None:
    with pytest.raises(ValueError, match="nesterov"):
        SgdHyperparameters(0.1, nesterov=True)
    with pytest.raises(ValueError, match="nesterov"):
        SgdHyperparameters(0.1, momentum=0.9, dampening=0.1, nesterov=True)


def test_values_are_stored_as_python_floats() -> None:
    h = AdamHyperparameters(np.float32(0.5), beta1=np.float64(0.8), weight_decay=1)
    assert type(h.lr) is float and type(h.beta1) is float and type(h.weight_decay) is float


def test_adam_kernel_args_are_torchs_coefficients_in_the_buffer_dtype() -> None:
    lr, b1, b2, eps, wd = 0.01, 0.9, 0.99, 1e-8, 0.1
    for decoupled in (False, True):
        h = AdamHyperparameters(lr, b1, b2, eps, wd, decoupled)
        args = h.kernel_args(3, np.float32)
        assert all(type(a) is np.float32 for a in args)
        l2, decay = (0.0, 1 - lr * wd) if decoupled else (wd, 1.0)
        expected = (b1, 1 - b1, b2, 1 - b2, l2, decay, lr / (1 - b1**3), 1 / math.sqrt(1 - b2**3))
        np.testing.assert_array_equal(args[:8], np.array(expected, dtype=np.float32))
        assert args[8] == np.float32(eps)
    assert all(type(a) is np.float64 for a in h.kernel_args(1, np.float64))


def test_sgd_kernel_args_mark_the_first_step_in_the_buffer_dtype() -> None:
    h = SgdHyperparameters(0.1, momentum=0.9, dampening=0.0, weight_decay=0.01, nesterov=True)
    args = h.kernel_args(1, np.float32)
    assert args == (np.float32(0.1), np.float32(0.9), 1.0, np.float32(0.01), True, True)
    assert all(type(a) is np.float32 for a in args[:4])  # float32 math, as torch's
    assert all(type(a) is np.float64 for a in h.kernel_args(1, np.float64)[:4])
    assert h.kernel_args(2, np.float32)[-1] is False


def test_sgd_kernel_args_are_made_once_per_dtype() -> None:
    """The scalars were four NumPy scalars made afresh on every step (a
    step's `kernel_args` call took 1-2 us); the values are frozen, so they
    are made once per dtype, and an edited copy gets its own."""
    h = SgdHyperparameters(0.1, momentum=0.9, dampening=0.25, weight_decay=0.01)
    f32 = np.dtype(np.float32)  # as the kernels pass it: their buffers' dtype
    first, later = h.kernel_args(1, f32), h.kernel_args(7, f32)
    assert all(a is b for a, b in zip(first[:4], later[:4], strict=True))
    assert (first[-1], later[-1]) == (True, False)
    assert type(h.kernel_args(2, np.float64)[0]) is np.float64  # its own dtype's
    edited = dataclasses.replace(h, lr=0.5)
    assert edited.kernel_args(2, np.float32)[:4] == (0.5, 0.9, 0.75, np.float32(0.01))
    assert h.kernel_args(2, np.float32)[0] == np.float32(0.1)  # the original is unchanged
    assert h == SgdHyperparameters(0.1, momentum=0.9, dampening=0.25, weight_decay=0.01)
    assert "_scalars" not in repr(h)
    copied = pickle.loads(pickle.dumps(h))
    assert copied == h and copied.kernel_args(3, np.float32) == h.kernel_args(3, np.float32)


def test_frozen() -> None:
    h = SgdHyperparameters(0.1)
    with pytest.raises(AttributeError):
        h.lr = 1e39  # type: ignore[misc]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_finite_in_agrees_with_the_cast_at_the_overflow_threshold(dtype: type) -> None:
    """`finite_in` compares instead of casting: it must agree with the cast
    on both sides of the value that rounds to infinity."""
    threshold = (2.0 - 2.0**-24) * 2.0**127
    values = [threshold, np.nextafter(threshold, 0.0), 3.4028235e38, 1e39, 1e308, np.inf, np.nan]
    with np.errstate(over="ignore"):
        for v in [*values, *(-x for x in values)]:
            cast = bool(np.isfinite(np.dtype(dtype).type(v)))
            assert finite_in(float(v), np.dtype(dtype)) is cast, v


def test_adam_kernel_args_take_a_step_beyond_floats_range() -> None:
    """beta ** 10**400 raised OverflowError from adam_step; past 2**60 steps
    1 - beta**t is 1.0 for every beta < 1, so the coefficients are those of
    any later step."""
    hyper = AdamHyperparameters(lr=1e-3, beta1=1 - 2**-53, beta2=0.999)
    late = hyper.kernel_args(10**400, np.float64)
    assert late == hyper.kernel_args(2**60, np.float64) == hyper.kernel_args(2**62, np.float64)
    assert late[6] == np.float64(1e-3)  # the step size: lr / (1 - 0)


@pytest.mark.parametrize(
    "tiny",
    [
        Fraction(1, 10**400),
        Fraction(-1, 10**400),
        pytest.param(
            np.longdouble(2.0) ** -1100,
            marks=pytest.mark.skipif(
                np.finfo(np.longdouble).nexp <= 11, reason="long double is float64 here"
            ),
        ),
    ],
    ids=["fraction", "negative fraction", "longdouble"],
)
@pytest.mark.parametrize("dtype", [F32, F64])
def test_given_in_refuses_a_nonzero_value_that_float_makes_0(tiny: Real, dtype: Any) -> None:
    """`float()` makes these 0.0 (below float64's range): refused like 1e-50
    in float32, in the same message shape, not taken as 0."""
    assert float(tiny) == 0.0 and tiny != 0
    with pytest.raises(ValueError, match=rf"^lr=.+ rounds to 0 in {dtype}; give 0 or a value >= "):
        given_in("lr", tiny, dtype)
    with pytest.raises(ValueError, match="lr=1e-50 rounds to 0 in float32; give 0 or"):
        given_in("lr", 1e-50, F32)


@pytest.mark.parametrize("zero", [0, 0.0, -0.0, Fraction(0), np.longdouble(0.0)])
def test_given_in_takes_a_zero_as_0(zero: Real) -> None:
    assert given_in("weight_decay", zero, F64) == 0.0


def test_a_decimal_is_no_real_number() -> None:
    """`Decimal` is not a `numbers.Real`: refused whatever its value."""
    with pytest.raises(TypeError, match="lr must be a real number, got Decimal"):
        given_in("lr", Decimal("1e-400"), F64)
