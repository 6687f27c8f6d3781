"""`OptimizerKind` in the dtype it runs in: what is wrong in every dtype is
refused when the kind is built; what only float32 cannot hold (`lr=1e39`,
`eps=1e-50`) when an optimizer of that dtype is built, takes a new rule
(`set_lr`, `load_state_dict`) or a scheduled rate, with nothing changed."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from atomr.train import OptimizerKind
from atomr.train.core.model import LayerNorm
from atomr.train.core.schedule import StepLR


@pytest.mark.parametrize(
    ("build", "name"),
    [
        (lambda: OptimizerKind.sgd(1e39), "lr"),
        (lambda: OptimizerKind.adam(1e39), "lr"),
        (lambda: OptimizerKind.adamw(0.1, weight_decay=1e39), "weight_decay"),
        (lambda: OptimizerKind.sgd(0.1, momentum=1e39), "momentum"),
        (lambda: OptimizerKind.adam(0.1).with_lr(1e39), "lr"),
        (lambda: OptimizerKind.from_config({"name": "adam", "lr": 1e39}), "lr"),
    ],
)
def test_values_infinite_in_float32_are_refused_when_a_float32_state_is_built(
    build: Any, name: str
) -> None:
    """1e39 is finite in float64: the kind takes it, and so does a float64
    optimizer; a float32 one is refused when it is built, naming the value
    and the dtype, not at its first step."""
    kind = build()
    assert kind.create(2, dtype=np.float64).dtype == np.float64
    with pytest.raises(
        ValueError,
        match=f"cannot compute in float32: {name} must be finite in float32, got 1e\\+39",
    ):
        kind.create(2, dtype=np.float32)


@pytest.mark.parametrize(
    ("build", "needle"),
    [
        (lambda: OptimizerKind.sgd(10**400), "lr must be finite in float64"),
        (lambda: OptimizerKind.adam(0.1, eps=float("nan")), "eps must be finite in float64"),
        (lambda: OptimizerKind.adam(0.1, eps=-1e-50), "eps must be >= 0"),
        (lambda: OptimizerKind.adam(0.1).with_lr(float("inf")), "lr must be finite in float64"),
    ],
)
def test_what_is_wrong_in_every_dtype_is_refused_when_the_kind_is_built(
    build: Any, needle: str
) -> None:
    with pytest.raises(ValueError, match=needle):
        build()


def test_create_refuses_a_dtype_the_models_do_not_compute_in() -> None:
    with pytest.raises(ValueError, match="dtype must be float32 or float64, got float16"):
        OptimizerKind.adam(0.1).create(2, dtype=np.float16)


def test_set_lr_checks_the_rate_in_the_optimizers_dtype_with_nothing_changed() -> None:
    narrow = OptimizerKind.sgd(0.1).create(2)
    with pytest.raises(ValueError, match="sgd cannot compute in float32: lr must be finite"):
        narrow.set_lr(1e39)
    with pytest.raises(ValueError, match="lr=1e-50 rounds to 0 in float32"):
        narrow.set_lr(1e-50)
    assert narrow.kind.lr == 0.1
    wide = OptimizerKind.sgd(0.1).create(2, dtype=np.float64)
    assert wide.set_lr(1e-50) == 0.1 and wide.kind.lr == 1e-50


def test_load_state_dict_checks_the_rule_in_the_optimizers_dtype_with_nothing_changed() -> None:
    saved = OptimizerKind.adam(0.1, eps=1e-50).create(2, dtype=np.float64).state_dict()
    narrow = OptimizerKind.adam(0.1).create(2)
    with pytest.raises(ValueError, match="adam cannot compute in float32: eps=1e-50 rounds to 0"):
        narrow.load_state_dict(saved)
    assert narrow.kind.eps == 1e-8 and narrow.step_count == 0
    wide = OptimizerKind.adam(0.1).create(2, dtype=np.float64)
    wide.load_state_dict(saved)
    assert wide.kind.eps == 1e-50


def test_float64_adam_with_an_eps_float32_cannot_hold_matches_the_formula() -> None:
    """eps=1e-50 is 0 in float32, but a float64 model uses it: one Adam step
    equals the float64 NumPy formula (torch's), in which eps dominates the
    denominator of a gradient of 1e-60 (the update is lr * 1e-10, not lr)
    and keeps a zero gradient's update 0 (not 0 / 0)."""
    lr, b1, b2, eps = 0.1, 0.9, 0.999, 1e-50
    p0 = np.array([0.5, -0.25, 1.0, 2.0])
    g = np.array([1e-60, 0.0, -0.3, 2.0])
    params = p0.copy()
    OptimizerKind.adam(lr, betas=(b1, b2), eps=eps).create(4, dtype=np.float64).step(params, g)
    m, v = (1 - b1) * g, (1 - b2) * g * g
    expected = p0 - (lr / (1 - b1)) * m / (np.sqrt(v) / np.sqrt(1 - b2) + eps)
    np.testing.assert_allclose(params, expected, rtol=1e-14, atol=0)
    assert params[0] == pytest.approx(p0[0] - lr * 1e-10, rel=1e-9) and params[1] == p0[1]


@pytest.mark.parametrize("name", ["lr", "momentum", "dampening", "weight_decay"])
def test_a_given_value_that_rounds_to_zero_in_float32_is_refused_for_float32(name: str) -> None:
    """1e-50 is 0 in float32: a float32 optimizer would silently not do what
    was asked; a float64 one does it."""
    kind = OptimizerKind.sgd(**{"lr": 0.1, "momentum": 0.5, name: 1e-50})
    with pytest.raises(ValueError, match=f"sgd cannot compute in float32: {name}=1e-50 rounds"):
        kind.create(2)
    kind.create(2, dtype=np.float64)
    assert OptimizerKind.sgd(**{"lr": 0.1, name: 0.0}).create(2).n == 2  # 0 itself is a value


def test_eps_that_rounds_to_zero_is_refused_but_a_schedule_may_decay_to_zero() -> None:
    with pytest.raises(ValueError, match="eps=1e-60 rounds to 0 in float32"):
        OptimizerKind.adam(0.1, eps=1e-60).create(1)
    decaying = OptimizerKind.sgd(1.0).with_schedule(StepLR(1, 1e-10))
    f32 = np.dtype(np.float32)
    assert np.float32(decaying.hyperparameters_at(5, f32).lr) == 0.0  # no error mid-run


@pytest.mark.parametrize("name", ["lr", "eps", "weight_decay"])
def test_a_given_value_below_float64s_range_is_refused_when_the_kind_is_built(name: str) -> None:
    """`Fraction(1, 10**400)` is not 0, but `float()` makes it 0.0: refused
    (`given_in` float64), not taken as 0; a LayerNorm's eps alike."""
    tiny = Fraction(1, 10**400)
    with pytest.raises(ValueError, match=rf"^{name}=Fraction\(1, .+ rounds to 0 in float64"):
        OptimizerKind.adamw(**{"lr": 0.1, name: tiny})
    with pytest.raises(ValueError, match=r"eps=Fraction\(1, .+ rounds to 0 in float64"):
        LayerNorm(4, eps=tiny)
