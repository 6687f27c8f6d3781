"""Optimizers against NumPy transcriptions of torch.optim's published algorithms."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from atomr.accel import AdamHyperparameters, SgdHyperparameters
from atomr.train import OptimizerKind
from tests.train.train_reference import RefAdam, RefSGD

N = 257
STEPS = 100

SGD_CASES = [
    dict(lr=0.05),
    dict(lr=0.05, weight_decay=0.01),
    dict(lr=0.05, momentum=0.9),
    dict(lr=0.05, momentum=0.9, dampening=0.3),
    dict(lr=0.05, momentum=0.9, weight_decay=0.02, nesterov=True),
    dict(lr=0.02, momentum=0.5, dampening=0.5, weight_decay=0.1),
]
ADAM_CASES = [
    dict(lr=1e-3),
    dict(lr=1e-2, betas=(0.8, 0.99), eps=1e-6),
    dict(lr=1e-2, weight_decay=0.05),
]


def _grads(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(N).astype(np.float32) for _ in range(STEPS)]


def _run(kind: OptimizerKind, ref, params: np.ndarray, grads) -> None:
    opt = kind.create(N)
    for g in grads:
        opt.step(params, g.copy())
        ref.step(g.copy())
    assert opt.step_count == STEPS
    # 1e-6 relative, elementwise, with the absolute floor relative to the
    # vector's scale: parameters that cross zero have no meaningful
    # elementwise relative error after 100 float32 roundings.
    np.testing.assert_allclose(params, ref.p, rtol=1e-6, atol=1e-6 * np.abs(ref.p).max())


def _start() -> np.ndarray:
    return np.random.default_rng(1).uniform(-1, 1, N).astype(np.float32)


@pytest.mark.parametrize("hp", SGD_CASES)
def test_sgd_matches_torch_algorithm(hp) -> None:
    params = _start()
    _run(OptimizerKind.sgd(**hp), RefSGD(_start(), **hp), params, _grads(2))
    assert not np.array_equal(params, _start())


@pytest.mark.parametrize("hp", ADAM_CASES)
def test_adam_matches_torch_algorithm(hp) -> None:
    params = _start()
    _run(OptimizerKind.adam(**hp), RefAdam(_start(), **hp), params, _grads(3))


@pytest.mark.parametrize("wd", [0.01, 0.1, 0.0])
def test_adamw_matches_torch_algorithm(wd) -> None:
    params = _start()
    ref = RefAdam(_start(), lr=1e-2, weight_decay=wd, decoupled=True)
    _run(OptimizerKind.adamw(1e-2, weight_decay=wd), ref, params, _grads(4))


def test_adamw_differs_from_adam_with_decay() -> None:
    g = _grads(5)[:10]
    a, b = _start(), _start()
    opt_a, opt_b = (
        OptimizerKind.adam(1e-2, weight_decay=0.1).create(N),
        OptimizerKind.adamw(1e-2, weight_decay=0.1).create(N),
    )
    for x in g:
        opt_a.step(a, x)
        opt_b.step(b, x)
    assert not np.allclose(a, b)


@pytest.mark.parametrize(
    "kind", [OptimizerKind.sgd(0.1, momentum=0.9, nesterov=True), OptimizerKind.adamw(1e-2)]
)
def test_state_dict_round_trip_is_bit_identical(kind) -> None:
    grads = _grads(6)
    straight = _start()
    opt = kind.create(N)
    for g in grads:
        opt.step(straight, g)
    resumed = _start()
    first = kind.create(N)
    for g in grads[:40]:
        first.step(resumed, g)
    second = kind.create(N)
    second.load_state_dict(first.state_dict())
    assert second.step_count == 40
    for g in grads[40:]:
        second.step(resumed, g)
    np.testing.assert_array_equal(resumed, straight)


def test_load_state_dict_rejects_other_kind_and_size() -> None:
    sgd = OptimizerKind.sgd(0.1, momentum=0.9).create(N)
    sgd.step(_start(), _grads(7)[0])
    with pytest.raises(ValueError, match="sgd"):
        OptimizerKind.adam(0.1).create(N).load_state_dict(sgd.state_dict())
    with pytest.raises(ValueError, match="shape"):
        OptimizerKind.sgd(0.1, momentum=0.9).create(N + 1).load_state_dict(sgd.state_dict())


@pytest.mark.parametrize(
    ("kind", "missing"),
    [
        (OptimizerKind.adam(0.1), "exp_avg"),
        (OptimizerKind.adamw(0.1), "exp_avg_sq"),
        (OptimizerKind.sgd(0.1, momentum=0.9), "momentum_buffer"),
    ],
)
def test_a_state_missing_a_buffer_its_step_needs_is_refused(kind, missing: str) -> None:
    # was loaded: Adam's next step failed inside the kernel (a typing error),
    # SGD's silently started its momentum afresh
    first = kind.create(N)
    first.step(_start(), _grads(7)[0])
    state = first.state_dict()
    del state[missing]
    fresh = kind.create(N)
    with pytest.raises(ValueError, match=f"buffer '{missing}' is missing at step 1"):
        fresh.load_state_dict(state)
    assert fresh.step_count == 0


def test_plain_sgd_needs_no_momentum_buffer() -> None:
    first = OptimizerKind.sgd(0.1).create(N)
    first.step(_start(), _grads(7)[0])
    state = first.state_dict()
    state.pop("momentum_buffer", None)
    second = OptimizerKind.sgd(0.1).create(N)
    second.load_state_dict(state)
    assert second.step_count == 1


def test_step_rejects_wrong_shape_and_dtype() -> None:
    opt = OptimizerKind.sgd(0.1).create(N)
    p = _start()
    with pytest.raises(ValueError, match="shape"):
        opt.step(p, np.zeros(N + 1, dtype=np.float32))
    with pytest.raises(ValueError, match="float32"):
        opt.step(p, np.zeros(N, dtype=np.float64))
    np.testing.assert_array_equal(p, _start())


def test_hyper_parameters_are_validated() -> None:
    with pytest.raises(ValueError, match="nesterov"):
        OptimizerKind.sgd(0.1, nesterov=True)
    with pytest.raises(ValueError, match="nesterov"):
        OptimizerKind.sgd(0.1, momentum=0.9, dampening=0.1, nesterov=True)
    with pytest.raises(ValueError, match="lr"):
        OptimizerKind.sgd(-1.0)
    with pytest.raises(ValueError, match="betas"):
        OptimizerKind.adam(0.1, betas=(1.0, 0.9))
    with pytest.raises(ValueError, match=">= 1"):
        OptimizerKind.adam(0.1).create(0)
    assert OptimizerKind.adamw(0.3).lr == 0.3
    assert OptimizerKind.adamw(0.3).weight_decay == 0.01
    kind = OptimizerKind.adam(1e-3, betas=(0.8, 0.9))
    assert OptimizerKind.from_config(kind.to_config()) == kind


def test_the_kind_resolves_its_hyperparameters_once() -> None:
    """The validated kernel arguments are built with the kind, and carried
    (the same object) into every step; equality ignores them."""
    kind = OptimizerKind.adamw(0.01, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)
    hyper = kind.hyperparameters
    assert isinstance(hyper, AdamHyperparameters)
    assert (hyper.lr, hyper.beta1, hyper.beta2, hyper.eps, hyper.weight_decay) == (
        0.01,
        0.8,
        0.95,
        1e-6,
        0.1,
    )
    assert hyper.decoupled and not OptimizerKind.adam(0.01).hyperparameters.decoupled
    opt = kind.create(N)
    assert opt.kind.hyperparameters is hyper
    sgd = OptimizerKind.sgd(0.1, momentum=0.9, nesterov=True).hyperparameters
    assert sgd == SgdHyperparameters(0.1, momentum=0.9, nesterov=True)
    assert kind.with_lr(0.5).hyperparameters.lr == 0.5
    assert OptimizerKind.from_config(kind.to_config()) == kind


def test_settings_of_the_other_rule_are_refused() -> None:
    with pytest.raises(ValueError, match="momentum does not apply to adam"):
        OptimizerKind("adam", 0.1, momentum=0.9)
    with pytest.raises(ValueError, match="betas does not apply to sgd"):
        OptimizerKind("sgd", 0.1, betas=(0.5, 0.5))
    with pytest.raises(ValueError, match="unknown optimizer"):
        OptimizerKind("lamb", 0.1)


@pytest.mark.parametrize(
    "kind",
    [OptimizerKind.sgd(0.05), OptimizerKind.sgd(0.05, momentum=0.9), OptimizerKind.adam(0.01)],
    ids=["sgd", "sgd-momentum", "adam"],
)
def test_weights_sharing_the_gradients_memory_are_refused(kind: OptimizerKind) -> None:
    """`step(g, g)` wrote the weights over the gradient, and `step_into` an
    output over an input it must leave as it was: refused, nothing changed."""
    opt = kind.create(N)
    opt.step(_start(), _grads(5)[0])  # some state to keep
    state = {k: None if v is None else v.copy() for k, v in opt.buffers().items()}
    params, g = _start(), _grads(5)[1]
    calls = {
        "params shares memory with grads": lambda: opt.step(g, g),
        "params_out shares memory with grads": lambda: opt.step_into(params, g, g, {}),
        "params_out shares memory with params": lambda: opt.step_into(params, g, params, {}),
    }
    for needle, call in calls.items():
        with pytest.raises(ValueError, match=needle):
            call()
        np.testing.assert_array_equal(params, _start())
        np.testing.assert_array_equal(g, _grads(5)[1])
        assert opt.step_count == 1
        for name, buf in opt.buffers().items():
            np.testing.assert_array_equal(buf, state[name], err_msg=name)


@pytest.mark.parametrize(
    "kind",
    [OptimizerKind.sgd(0.05, momentum=0.9), OptimizerKind.adam(0.01)],
    ids=["sgd-momentum", "adam"],
)
def test_state_buffers_sharing_memory_with_the_step_buffers_are_refused(
    kind: OptimizerKind,
) -> None:
    """A spare buffer that is the gradient, the current state or `params_out`
    (the new state written over it), or weights that are a state buffer:
    refused, nothing changed."""
    opt = kind.create(N)
    opt.step(_start(), _grads(6)[0])
    first = next(iter(opt.buffers()))
    params, g, out = _start(), _grads(6)[1], np.zeros(N, np.float32)
    state = {k: v.copy() for k, v in opt.buffers().items()}
    calls = {
        f"spare\\['{first}'\\] shares memory with grads": {first: g},
        f"spare\\['{first}'\\] shares memory with {first}": opt.buffers(),
        f"params_out shares memory with spare\\['{first}'\\]": {first: out},
    }
    for needle, spare in calls.items():
        with pytest.raises(ValueError, match=needle):
            opt.step_into(params, g, out, spare)
    with pytest.raises(ValueError, match=f"params shares memory with {first}"):
        opt.step(opt.buffers()[first], g)
    np.testing.assert_array_equal(params, _start())
    np.testing.assert_array_equal(g, _grads(6)[1])
    np.testing.assert_array_equal(out, np.zeros(N, np.float32))
    assert opt.step_count == 1
    for name, buf in opt.buffers().items():
        np.testing.assert_array_equal(buf, state[name], err_msg=name)


def test_a_state_buffer_of_the_wrong_size_is_refused_not_indexed_past_its_end() -> None:
    """`set_buffer` checks the buffer; one adopted unchecked is checked by the
    next `step` (the kernel read 8 moments from 4 elements of memory)."""
    opt = OptimizerKind.adam(0.01).create(8)
    moments = opt.exp_avg
    frozen = np.zeros(8, np.float32)
    frozen.flags.writeable = False
    bad = {
        "must have shape": np.zeros(4, np.float32),
        "must be float32": np.zeros(8, np.float64),
        "read-only": frozen,
        "not C-contiguous": np.zeros(16, np.float32)[::2],
    }
    for needle, buf in bad.items():
        with pytest.raises(ValueError, match=needle):
            opt.set_buffer("exp_avg", buf)
        assert opt.exp_avg is moments
    with pytest.raises(TypeError, match="exp_avg must be a NumPy array"):
        opt.set_buffer("exp_avg", [0.0] * 8)
    with pytest.raises(TypeError, match="params must be a NumPy array"):
        opt.step([1.0] * 8, np.ones(8, np.float32))
    opt.adopt({"exp_avg": np.zeros(4, np.float32), "exp_avg_sq": opt.exp_avg_sq}, 0)
    params = np.ones(8, np.float32)
    with pytest.raises(ValueError, match="exp_avg must have shape"):
        opt.step(params, np.ones(8, np.float32))
    np.testing.assert_array_equal(params, np.ones(8, np.float32))
    assert opt.step_count == 0


@pytest.mark.parametrize(
    "kind",
    [OptimizerKind.sgd(0.05, momentum=0.9), OptimizerKind.adamw(0.01)],
    ids=["sgd", "adamw"],
)
def test_step_into_equals_step_and_leaves_the_state(kind: OptimizerKind) -> None:
    """Out of place (`step_into`, then `adopt`) gives the bits of `step`, and
    until adopted nothing of the optimizer changed."""
    a, b = kind.create(N), kind.create(N)
    pa, pb = _start(), _start()
    for g in _grads(7)[:3]:
        a.step(pa, g)
        before = {k: None if v is None else v.copy() for k, v in b.buffers().items()}
        out = np.empty_like(pb)
        new = b.step_into(pb, g, out, {})
        assert b.step_count == a.step_count - 1
        for k, v in b.buffers().items():
            if v is not None:
                np.testing.assert_array_equal(v, before[k])
        b.adopt(new, b.step_count + 1)
        pb = out
        np.testing.assert_array_equal(pb, pa)
        for k, v in a.buffers().items():
            np.testing.assert_array_equal(b.buffers()[k], v)


@pytest.mark.parametrize(
    "kind",
    [OptimizerKind.sgd(0.05, momentum=0.9), OptimizerKind.adam(0.01)],
    ids=["sgd", "adam"],
)
def test_step_into_checks_its_buffers_and_the_unchecked_step_gives_the_same_bits(
    kind: OptimizerKind,
) -> None:
    """`step_into` refuses a wrong shape, dtype or read-only output with the
    state untouched; `step_into_unchecked` (the atomic apply's) equals it."""
    checked, trusted = kind.create(N), kind.create(N)
    params, g = _start(), _grads(3)[0]
    bad = {
        "shape": (params, g[:-1], np.empty_like(params)),
        "dtype": (params, g.astype(np.float64), np.empty_like(params)),
        "read-only": (params, g, np.empty_like(params)),
    }
    bad["read-only"][2].flags.writeable = False
    before = {k: None if v is None else v.copy() for k, v in checked.buffers().items()}
    for what, (p, grads, out) in bad.items():
        with pytest.raises((ValueError, TypeError)):
            checked.step_into(p, grads, out, {})
        for name, buf in checked.buffers().items():
            if buf is None:
                assert before[name] is None, what
            else:
                np.testing.assert_array_equal(buf, before[name], err_msg=what)
    out_a, out_b = np.empty_like(params), np.empty_like(params)
    new_a = checked.step_into(params, g, out_a, {})
    new_b = trusted.step_into_unchecked(params, g, out_b, {})
    np.testing.assert_array_equal(out_a, out_b)
    for name, buf in new_a.items():
        np.testing.assert_array_equal(buf, new_b[name])


@pytest.mark.parametrize(
    ("betas", "error", "needle"),
    [
        ((0.9,), ValueError, r"betas must be a pair \(beta1, beta2\), got \(0.9,\)"),
        ((0.9, 0.99, 0.1), ValueError, r"betas must be a pair \(beta1, beta2\)"),
        (0.9, TypeError, "betas must be a list, tuple or 1-D array of two numbers, got 0.9"),
    ],
)
def test_betas_that_are_no_pair_are_refused_naming_betas(
    betas: Any, error: type[Exception], needle: str
) -> None:
    """`adam(lr, betas=(0.9,))` was 'not enough values to unpack', naming nothing."""
    for build in (OptimizerKind.adam, OptimizerKind.adamw):
        with pytest.raises(error, match=needle):
            build(0.1, betas=betas)


@pytest.mark.parametrize(
    ("build", "needle"),
    [
        (lambda: OptimizerKind.sgd("0.1"), "lr must be a real number, got str"),
        (lambda: OptimizerKind.sgd(0.1, momentum=None), "momentum must be a real number"),
        (
            lambda: OptimizerKind.sgd(0.1, momentum=0.9, nesterov="no"),
            "nesterov must be True or False",
        ),
        (lambda: OptimizerKind.adam(True), "lr must be a real number, got bool"),
        (lambda: OptimizerKind.adamw(0.1, betas=("0.9", 0.99)), "beta1 must be a real number"),
        (lambda: OptimizerKind.adam(0.1).with_lr("0.2"), "lr must be a real number, got str"),
    ],
)
def test_settings_that_are_not_numbers_are_refused_not_converted(build: Any, needle: str) -> None:
    """`float("0.1")` would take a string: the rule is built from numbers only."""
    with pytest.raises(TypeError, match=needle):
        build()
