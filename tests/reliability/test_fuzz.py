"""Hostile input on every public constructor and message, with hypothesis.

Each case must end in a clear exception of the documented type (or succeed
when the input happens to be valid): never a hang, a crash of the actor
system, or a changed weight. Examples are bounded (max_examples 40,
deadline None) so each test takes seconds.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from numbers import Real
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from atomr import Actor, ActorSystem, InvalidActorNameError, Props
from atomr.accel import Device, backend_for, cpu_devices
from atomr.train import (
    DataParallelTrainer,
    Evaluate,
    GetWeights,
    LossKind,
    Mlp,
    OptimizerKind,
    PipelineOptions,
    PipelineParallelTrainer,
    Step,
    TensorParallelTrainer,
    Trainer,
    TrainerConfig,
)

FUZZ = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
ANYTHING = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.lists(st.integers(-3, 10), max_size=4),
    st.just(object()),
)


class Echo(Actor):
    """Answers with the message."""

    def receive(self, message: Any) -> Any:
        """Echo."""
        return message


# ------------------------------------------------------------- runtime


@FUZZ
@given(factory=ANYTHING)
def test_props_rejects_non_callables(factory: Any) -> None:
    if callable(factory):
        return
    with pytest.raises(TypeError):
        Props(factory)


@FUZZ
@given(names=st.lists(st.one_of(st.text(max_size=8), ANYTHING), min_size=1, max_size=6))
def test_spawn_names_are_accepted_or_refused_clearly(names: list[Any]) -> None:
    async def run() -> None:
        async with ActorSystem("fuzz") as system:
            for name in names:
                try:
                    ref = system.spawn(Props(Echo), name=name)
                except InvalidActorNameError:  # bad or taken (both ValueErrors)
                    continue
                assert await ref.ask("hi", timeout=5.0) == "hi"
            with pytest.raises(TypeError):
                system.spawn(Echo, name="x")  # type: ignore[arg-type]

    asyncio.run(run())


@FUZZ
@given(timeouts=st.lists(ANYTHING, min_size=1, max_size=8))
def test_ask_timeouts_are_validated(timeouts: list[Any]) -> None:
    async def run() -> None:
        async with ActorSystem("fuzz") as system:
            ref = system.spawn(Props(Echo))
            for t in timeouts:
                ok = t is None or (not isinstance(t, bool) and isinstance(t, int | float) and t > 0)
                if ok:
                    assert await ref.ask(1, timeout=t) == 1
                else:
                    with pytest.raises((TypeError, ValueError)):
                        await ref.ask(1, timeout=t)
            assert await ref.ask(2, timeout=5.0) == 2  # the actor is untouched

    asyncio.run(run())


# ------------------------------------------------------------- devices, kernels


@FUZZ
@given(
    name=st.one_of(
        st.text(max_size=10), st.from_regex(r"(cpu|cuda)(:-?\d{1,3})?", fullmatch=True), ANYTHING
    )
)
def test_device_parse(name: Any) -> None:
    try:
        dev = Device.parse(name)
    except (ValueError, TypeError):
        return
    assert str(dev).startswith(("cpu", "cuda"))


ARRAYS = hnp.arrays(
    dtype=st.sampled_from([np.float32, np.float64, np.int64, np.float16, np.bool_]),
    shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5),
    elements=None,
)


@FUZZ
@given(
    a=ARRAYS,
    b=ARRAYS,
    out=ARRAYS,
    kind=st.sampled_from(["relu", "tanh", "gelu", "identity", "bogus"]),
)
def test_cpu_kernels_validate_before_writing(
    a: np.ndarray, b: np.ndarray, out: np.ndarray, kind: str
) -> None:
    be = backend_for("cpu:0")
    for call in (
        lambda: be.matmul(a, b, out),
        lambda: be.activation_forward(kind, a, out),
        lambda: be.activation_backward(kind, a, b, out),
        lambda: be.axpy(0.5, a, out),
        lambda: be.mse(a, b, out),
        lambda: be.squared_norm(a),
    ):
        snapshot = out.copy()
        try:
            with np.errstate(all="ignore"):
                call()
        except (TypeError, ValueError):
            np.testing.assert_array_equal(out, snapshot)  # refused before writing


# ------------------------------------------------------------- training constructors


@FUZZ
@given(
    sizes=st.one_of(
        st.lists(st.integers(-2, 8), max_size=4),
        st.lists(st.integers(10**9, 10**13), min_size=2, max_size=3),
        ANYTHING,
    ),
    activation=st.one_of(
        st.sampled_from(["relu", "tanh", "gelu", "identity"]), st.text(max_size=5)
    ),
)
def test_mlp_constructor(sizes: Any, activation: str) -> None:
    try:
        model = Mlp(sizes, activation=activation)
    except (ValueError, TypeError, MemoryError):
        return
    assert model.params.shape == (model.n_params,) and np.isfinite(model.params).all()


LOSS_NAMES = ("mse", "cross_entropy")


@FUZZ
@given(
    name=st.one_of(st.sampled_from(LOSS_NAMES), ANYTHING),
    weights=st.one_of(
        st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=4),
        st.lists(st.floats(0, 10), min_size=1, max_size=4),
        ANYTHING,
    ),
)
@example(name="mse", weights=[0.5, 2])
@example(name="cross_entropy", weights=[0.0, 1.0, 3.0])
@example(name=None, weights=[1.0, -3.6383923009198515e-66])  # -0.0 in float32: still negative
def test_loss_kind_constructors(name: Any, weights: Any) -> None:
    try:
        kind = LossKind(name)
    except (ValueError, TypeError):
        assert not (isinstance(name, str) and name in LOSS_NAMES), name
    else:
        assert isinstance(kind.name, str) and kind.name in LOSS_NAMES
        assert kind.class_weights is None
        assert kind in (LossKind.MSE, LossKind.CROSS_ENTROPY)
        assert kind.is_classification == (kind.name == "cross_entropy")
    try:
        loss = LossKind.weighted_cross_entropy(weights)
    except (ValueError, TypeError):
        return
    assert loss.name == "cross_entropy" and loss.is_classification
    assert isinstance(loss.class_weights, tuple) and len(loss.class_weights) >= 1
    assert all(isinstance(w, float) for w in loss.class_weights)
    w = np.asarray(loss.class_weights)
    assert np.isfinite(w).all() and (w >= 0).all() and (w > 0).any()
    np.testing.assert_array_equal(w, np.asarray(weights, dtype=np.float64).reshape(-1))


@FUZZ
@given(
    lr=ANYTHING,
    momentum=ANYTHING,
    betas=st.one_of(st.tuples(ANYTHING, ANYTHING), ANYTHING),
    eps=ANYTHING,
)
def test_optimizer_kinds(lr: Any, momentum: Any, betas: Any, eps: Any) -> None:
    for make in (
        lambda: OptimizerKind.sgd(lr, momentum=momentum),
        lambda: OptimizerKind.adam(lr, betas=betas, eps=eps),
        lambda: OptimizerKind.adamw(lr, betas=betas, eps=eps),
    ):
        try:
            kind = make()
        except (ValueError, TypeError):
            continue
        assert math.isfinite(kind.lr) and kind.lr >= 0


def _valid_clip(clip: Any) -> bool:
    """None, or a positive finite number, not a bool (what `TrainerConfig` documents)."""
    if clip is None:
        return True
    return isinstance(clip, Real) and not isinstance(clip, bool) and 0.0 < clip < math.inf


def _valid_accumulation(accum: Any) -> bool:
    return isinstance(accum, int) and not isinstance(accum, bool) and accum >= 1


@FUZZ
@given(
    opt=ANYTHING,
    loss=ANYTHING,
    clip=st.one_of(st.floats(1e-6, 1e6), st.integers(-2, 5), ANYTHING),
    accum=st.one_of(st.integers(-2, 5), ANYTHING),
)
@example(opt=None, loss=None, clip=None, accum=1)
@example(opt=None, loss=None, clip=0.5, accum=4)
@example(opt=None, loss=None, clip=0, accum=True)
def test_trainer_config(opt: Any, loss: Any, clip: Any, accum: Any) -> None:
    sgd = OptimizerKind.sgd(0.1)
    for args in ((opt, loss, clip, accum), (sgd, LossKind.MSE, clip, accum)):
        valid = (
            isinstance(args[0], OptimizerKind)
            and isinstance(args[1], LossKind)
            and _valid_clip(clip)
            and _valid_accumulation(accum)
        )
        try:
            config = TrainerConfig(*args)
        except (ValueError, TypeError):
            assert not valid, f"a valid config was refused: {args!r}"
            continue
        assert valid, f"an invalid config was accepted: {config!r}"
        assert config.optimizer is args[0] and config.loss is args[1]
        assert config.gradient_clip is None or (
            math.isfinite(config.gradient_clip) and config.gradient_clip > 0
        )
        assert isinstance(config.accumulation_steps, int) and config.accumulation_steps >= 1


def test_trainer_config_refuses_a_string_clip() -> None:
    with pytest.raises(TypeError):
        TrainerConfig(OptimizerKind.sgd(0.1), LossKind.MSE, "1")


# ------------------------------------------------------------- Step / Evaluate on each trainer

SIZES = [6, 8, 3]
CE = TrainerConfig(OptimizerKind.adam(0.01), LossKind.CROSS_ENTROPY)


@pytest.fixture(scope="module")
def trainers() -> Iterator[tuple[asyncio.AbstractEventLoop, dict[str, Any]]]:
    """One of each trainer on a private loop, shared by the examples."""
    loop = asyncio.new_event_loop()

    async def build() -> tuple[ActorSystem, dict[str, Any]]:
        system = ActorSystem("fuzz-trainers")
        model = Mlp(SIZES, seed=0)
        refs = {
            "trainer": await Trainer.spawn(system, model, "cpu:0", CE),
            "data_parallel": await DataParallelTrainer.spawn(system, model, cpu_devices(2), CE),
            "tensor_parallel": await TensorParallelTrainer.spawn(system, model, cpu_devices(2), CE),
            "pipeline": await PipelineParallelTrainer.spawn(
                system, model, cpu_devices(2), CE, PipelineOptions(2)
            ),
        }
        return system, refs

    system, refs = loop.run_until_complete(build())
    yield loop, refs
    loop.run_until_complete(system.terminate())
    loop.close()


FEATURES = hnp.arrays(
    dtype=st.sampled_from([np.float32, np.float64, np.int32, np.float16, np.complex64]),
    shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=7),
    elements=None,
)
LABELS = st.one_of(
    hnp.arrays(
        dtype=st.sampled_from([np.int64, np.int8, np.uint8, np.float32, np.bool_]),
        shape=hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=7),
        elements=None,
    ),
    ANYTHING,
)


@pytest.mark.parametrize("which", ["trainer", "data_parallel", "tensor_parallel", "pipeline"])
@FUZZ
@given(features=st.one_of(FEATURES, ANYTHING), labels=LABELS, evaluate=st.booleans())
def test_bad_batches_are_refused_and_change_nothing(
    trainers: tuple[asyncio.AbstractEventLoop, dict[str, Any]],
    which: str,
    features: Any,
    labels: Any,
    evaluate: bool,
) -> None:
    loop, refs = trainers
    ref = refs[which]

    async def check() -> None:
        before = await ref.ask(GetWeights(), timeout=30)
        message = (Evaluate if evaluate else Step)(features, labels)
        try:
            await ref.ask(message, timeout=30)
        except (ValueError, TypeError, FloatingPointError):  # InvalidBatchError, NonFiniteError
            np.testing.assert_array_equal(await ref.ask(GetWeights(), timeout=30), before)
        else:
            if evaluate:
                np.testing.assert_array_equal(await ref.ask(GetWeights(), timeout=30), before)
        assert ref.is_alive

    loop.run_until_complete(check())
