"""Every built-in layer against float64 references: the backward pass against
central differences (`gradient_check`), attention and LayerNorm forward
against NumPy written out, the embedding's lookups, and dropout's mask (a
function of step and sample only: a split batch draws the whole batch's
mask)."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import numpy as np
import pytest

from atomr.train.core._cpu import cpu_backend
from atomr.train.core.model import (
    Activation,
    CausalSelfAttention,
    Dropout,
    Embedding,
    ForwardContext,
    Layer,
    LayerNorm,
    Linear,
    Residual,
    Sequential,
    gpt,
    layer_from_config,
    register_layer,
    registry,
)
from atomr.train.core.model.gradcheck import gradient_check

TOL = 1e-6


@pytest.mark.parametrize(
    ("layer", "in_shape"),
    [
        (Linear(5, 3), (5,)),
        (Linear(4, 6), (3, 4)),  # a sequence: rows x features
        (Activation("gelu"), (7,)),
        (Activation("tanh"), (2, 3)),
        (LayerNorm(6), (3, 6)),
        (CausalSelfAttention(8, 2), (5, 8)),
        (Residual([LayerNorm(4), Linear(4, 4), Activation("gelu")]), (3, 4)),
        (Dropout(0.3, seed=5), (4, 5)),
        # an identity inside: its input gradient is dy itself (was added into in place)
        (Residual([Residual([Dropout(0.0)])]), (2, 3)),
    ],
    ids=lambda v: type(v).__name__ if not isinstance(v, tuple) else str(v),
)
def test_backward_equals_finite_differences(layer, in_shape) -> None:
    assert gradient_check(layer, in_shape, batch=3) < TOL


@pytest.mark.parametrize(
    ("layer", "in_shape"),
    [
        (Linear(1, 1), (1,)),  # a single output
        (LayerNorm(1), (1, 1)),  # a row of width 1: xhat is 0
        (CausalSelfAttention(1, 1), (1, 1)),  # one token, one head of width 1
        (CausalSelfAttention(4, 4), (3, 4)),  # heads of width 1
        (CausalSelfAttention(2, 1), (1, 2)),  # one head, one token
    ],
    ids=["linear-1x1", "layernorm-d1", "attention-T1-d1", "attention-dh1", "attention-H1-T1"],
)
def test_backward_equals_finite_differences_at_edge_shapes_with_batch_1(layer, in_shape) -> None:
    assert gradient_check(layer, in_shape, batch=1) < TOL


def test_the_embedding_tables_gradient_equals_finite_differences() -> None:
    assert gradient_check(Embedding(7, 4, context=6), (5,), tokens=7) < TOL
    assert gradient_check(Embedding(2, 1, context=1), (1,), batch=1, tokens=2) < TOL


class Scale(Layer):
    """`y = x * w` per feature, its backward right or wrong in one mode (`bug`)."""

    kind = "scale-gradcheck-test"

    def __init__(self, width: int, bug: str = "") -> None:
        self.width, self.bug = width, bug

    def param_shapes(self) -> list[tuple[int, ...]]:
        return [(self.width,)]

    def init_params(self, rng: np.random.Generator) -> list[np.ndarray]:
        return [np.ones(self.width)]

    def out_shape(self, in_shape: tuple[int, ...]) -> tuple[int, ...]:
        return in_shape

    def forward(self, be: Any, params: list[Any], x: Any, ctx: ForwardContext) -> tuple[Any, Any]:
        return x * params[0], x

    def backward(self, be, params, grads, saved, dy, accumulate, input_grad) -> Any:  # noqa: ANN001
        dw = np.sum(dy * saved, axis=tuple(range(dy.ndim - 1)))
        adds = {"always overwrites": False, "always adds": True}.get(self.bug, accumulate)
        if self.bug == "nan weights":
            dw = dw * np.nan
        if input_grad or self.bug != "weights only with input_grad":
            grads[0][...] = grads[0] + dw if adds else dw
        if self.bug == "no input gradient":
            return None
        if self.bug == "one row of input gradient" and input_grad:
            return (dy * params[0])[:1]
        if input_grad or self.bug == "input_grad when not asked":
            return dy * params[0]
        return None

    def config(self) -> dict[str, Any]:
        return {"kind": self.kind, "width": self.width}


def test_a_right_backward_passes_gradient_check_in_every_mode() -> None:
    assert gradient_check(Scale(4), (4,)) < TOL
    assert gradient_check(Scale(4), (3, 4)) < TOL


@pytest.mark.parametrize(
    "bug",
    [
        "always overwrites",  # was: passed (8e-11), and trained wrong under the pipeline
        "weights only with input_grad",  # was: passed, and never trained as a first layer
        "always adds",  # was: passed (its buffers were zeros)
    ],
)
def test_gradient_check_catches_a_backward_wrong_in_one_mode(bug: str) -> None:
    assert gradient_check(Scale(4, bug), (4,)) > 0.1


def test_gradient_check_refuses_an_input_gradient_not_asked_for() -> None:
    with pytest.raises(ValueError, match=r"Scale\.backward returned an input gradient with"):
        gradient_check(Scale(4, "input_grad when not asked"), (4,))


def test_gradient_check_finds_a_nan_gradient_infinitely_wrong() -> None:
    """A NaN error compared as no error (`max(0.0, nan)` is 0.0): a backward
    of NaN weight gradients passed the check with 5e-11."""
    assert gradient_check(Scale(4, "nan weights"), (4,)) == math.inf


@pytest.mark.parametrize(
    ("bug", "needle"),
    [
        ("no input gradient", "the input gradient: the backward gave none, expected shape (2, 4)"),
        ("one row of input gradient", "gave shape (1, 4), expected shape (2, 4)"),
    ],
)
def test_gradient_check_refuses_an_input_gradient_missing_or_of_another_shape(
    bug: str, needle: str
) -> None:
    """None failed as 'unsupported operand type(s)'; one row of a batch of
    two broadcast against the numeric gradient (scored 0.77, not a shape error)."""
    with pytest.raises(ValueError) as info:
        gradient_check(Scale(4, bug), (4,))
    assert needle in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "error", "needle"),
    [
        ({"batch": 0}, ValueError, "batch must be >= 1"),  # was: 0.0, an empty check passed
        ({"batch": True}, TypeError, "batch must be an int"),
        ({"eps": 0.0}, ValueError, "eps must be finite and > 0"),  # was: a ZeroDivisionError
        ({"eps": float("nan")}, ValueError, "eps must be finite and > 0"),  # was: 0.0, passed
        ({"seed": -1}, ValueError, "seed must be >= 0"),
    ],
)
def test_gradient_check_refuses_arguments_that_check_nothing(
    kwargs: dict[str, Any], error: type, needle: str
) -> None:
    with pytest.raises(error, match=needle):
        gradient_check(Scale(4), (4,), **kwargs)


def _reference_attention(x: np.ndarray, params: list[np.ndarray], heads: int) -> np.ndarray:
    w_qkv, b_qkv, w_o, b_o = params
    batch, t_len, d = x.shape
    dh = d // heads
    qkv = x @ w_qkv + b_qkv
    q, k, v = (
        qkv[..., i * d : (i + 1) * d].reshape(batch, t_len, heads, dh).transpose(0, 2, 1, 3)
        for i in range(3)
    )
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(dh)
    scores = scores + np.triu(np.full((t_len, t_len), -np.inf), 1)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    out = (weights @ v).transpose(0, 2, 1, 3).reshape(batch, t_len, d)
    return out @ w_o + b_o


def test_attention_is_causal_softmax_attention() -> None:
    rng = np.random.default_rng(1)
    layer = CausalSelfAttention(12, 3)
    params = layer.init_params(rng)
    x = rng.standard_normal((2, 6, 12))
    y, _ = layer.forward(cpu_backend(), params, x, ForwardContext())
    np.testing.assert_allclose(y, _reference_attention(x, params, 3), rtol=1e-12, atol=1e-12)
    later = x.copy()
    later[:, 4:] += 1.0  # the future does not reach the past
    y2, _ = layer.forward(cpu_backend(), params, later, ForwardContext())
    np.testing.assert_array_equal(y2[:, :4], y[:, :4])


def test_layernorm_is_torch_layernorm() -> None:
    rng = np.random.default_rng(2)
    layer = LayerNorm(5)
    gamma, beta = rng.standard_normal(5), rng.standard_normal(5)
    x = rng.standard_normal((4, 5)) * 3 + 2
    y, _ = layer.forward(cpu_backend(), [gamma, beta], x, ForwardContext())
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    np.testing.assert_allclose(y, (x - mean) / np.sqrt(var + 1e-5) * gamma + beta, rtol=1e-12)


def test_the_embedding_adds_token_and_position_rows() -> None:
    rng = np.random.default_rng(3)
    layer = Embedding(9, 4, context=8)
    tokens, positions = layer.init_params(rng)
    ids = rng.integers(0, 9, size=(2, 5)).astype(np.int64)
    y, _ = layer.forward(cpu_backend(), [tokens, positions], ids, ForwardContext())
    np.testing.assert_array_equal(y, tokens[ids] + positions[:5])
    with pytest.raises(ValueError, match="T <= 8"):
        layer.out_shape((9,))


def test_dropout_depends_on_step_and_sample_only() -> None:
    layer = Dropout(0.5, seed=3)
    x = np.ones((8, 50), dtype=np.float32)
    be = cpu_backend()
    whole, _ = layer.forward(be, [], x, ForwardContext(step=4))
    assert 0.4 < float(np.mean(whole == 0)) < 0.6
    assert set(np.unique(whole)) == {0.0, 2.0}
    top, _ = layer.forward(be, [], x[:3], ForwardContext(step=4))
    rest, _ = layer.forward(be, [], x[3:], ForwardContext(step=4, sample_offset=3))
    np.testing.assert_array_equal(
        np.concatenate([top, rest]), whole
    )  # a split batch: the same mask
    other, _ = layer.forward(be, [], x, ForwardContext(step=5))
    assert not np.array_equal(other, whole)
    same, _ = layer.forward(be, [], x, ForwardContext(train=False))
    assert same is x


def test_configs_round_trip_and_bad_ones_are_refused() -> None:
    block = Residual([LayerNorm(4, eps=1e-6), CausalSelfAttention(4, 2), Dropout(0.1, seed=2)])
    rebuilt = layer_from_config(block.config())
    assert rebuilt.config() == block.config()
    with pytest.raises(ValueError, match="unknown layer kind"):
        layer_from_config({"kind": "conv9d"})
    with pytest.raises(ValueError):
        layer_from_config({"kind": "linear", "in_features": 0, "out_features": 3})
    with pytest.raises(ValueError):
        layer_from_config({"kind": "linear", "in_features": 2, "out_features": 3, "bogus": 1})
    with pytest.raises(ValueError, match="divide"):
        CausalSelfAttention(6, 4)
    with pytest.raises(ValueError):
        Dropout(1.0)


_NOTEBOOK_CELL = """
@register_layer
class Twice(Layer):
    kind = "twice-test"
    version = VERSION
    def out_shape(self, in_shape): return in_shape
    def forward(self, be, params, x, ctx): return 2 * x, None
    def backward(self, be, params, grads, saved, dy, accumulate, input_grad): return 2 * dy
    def config(self): return {"kind": self.kind}
"""


def _run_cell(module: str, version: int, qualname: str = "Twice") -> type[Layer]:
    namespace = {"Layer": Layer, "register_layer": register_layer, "__name__": module}
    exec(_NOTEBOOK_CELL.replace("Twice", qualname).replace("VERSION", str(version)), namespace)
    cls: type[Layer] = namespace[qualname]
    return cls


def test_a_redefined_layer_class_replaces_its_kind_and_a_stranger_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(registry, "LAYERS", dict(registry.LAYERS))
    first = _run_cell("notebook", 1)
    assert register_layer(first) is first  # the same class again: nothing changes
    second = _run_cell("notebook", 2)  # the cell re-run; was: "kind 'twice-test' is taken"
    assert second is not first
    assert type(layer_from_config({"kind": "twice-test"})) is second
    for module, qualname in [("other_module", "Twice"), ("notebook", "Thrice")]:
        with pytest.raises(ValueError, match=r"'twice-test' is taken by notebook\.Twice; "):
            _run_cell(module, 3, qualname)
    assert type(layer_from_config({"kind": "twice-test"})) is second
    with pytest.raises(ValueError, match="taken by atomr.train.core.model.linear.Linear"):
        register_layer(type("Linear", (Linear,), {"__module__": "notebook"}))


class Misshapen(Layer):
    """The identity, but its forward output (`wrong == "forward"`) or its
    input gradient (`"backward"`) has one feature too many or too few."""

    kind = "misshapen-test"

    def __init__(self, wrong: str) -> None:
        self.wrong = wrong

    def param_shapes(self) -> list[tuple[int, ...]]:
        return []

    def init_params(self, rng: np.random.Generator) -> list[np.ndarray]:
        return []

    def out_shape(self, in_shape: tuple[int, ...]) -> tuple[int, ...]:
        return in_shape

    def forward(self, be: Any, params: list[Any], x: Any, ctx: ForwardContext) -> tuple[Any, Any]:
        return (np.concatenate([x, x[:, :1]], axis=1) if self.wrong == "forward" else x), None

    def backward(self, be, params, grads, saved, dy, accumulate, input_grad) -> Any:  # noqa: ANN001
        return dy[:, :-1].copy() if self.wrong == "backward" else dy

    def config(self) -> dict[str, Any]:
        return {"kind": self.kind, "wrong": self.wrong}


@pytest.mark.parametrize("wrong", ["forward", "backward"])
@pytest.mark.parametrize("nested", [False, True], ids=["top", "in-residual"])
def test_a_layer_returning_the_wrong_shape_is_named_not_run_past(wrong: str, nested: bool) -> None:
    # was: a heap overflow in the next layer's kernel (the process aborted)
    inner: Layer = Misshapen(wrong)
    block = Residual([inner]) if nested else inner
    model = Sequential([Linear(6, 8), Activation("tanh"), block, Linear(8, 3)], (6,))
    x = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    expected = f"Misshapen.{wrong} returned shape (4, {9 if wrong == 'forward' else 7})"
    with pytest.raises(ValueError, match=re.escape(expected + ", expected shape (4, 8)")):
        model.backward(model.forward_train(x), np.ones((4, 3), np.float32))


@pytest.mark.parametrize(
    ("ids", "error", "needle"),
    [
        ([[1, 2, 3, 10]], ValueError, "in [0, 10), got 1 .. 10"),
        ([[1, 2, 3, -1]], ValueError, "got -1 .. 3"),
        ([[1, 2, 3, 10_000_000]], ValueError, "got 1 .. 10000000"),  # was: a segfault
        ([[1.5, 2, 3, 4]], TypeError, "integers, got float64"),
    ],
)
def test_a_direct_forward_refuses_token_ids_outside_the_vocabulary(
    ids: list[list[float]], error: type, needle: str
) -> None:
    model = gpt(10, 4, n_layer=1, n_head=2, d_model=8, seed=0)
    assert model.forward(np.array([[1, 2, 3, 9]])).shape == (1, 4, 10)
    with pytest.raises(error, match=re.escape(needle)):
        model.forward(np.array(ids))


def test_numpy_scalars_build_layers_whose_configs_are_json() -> None:
    """`Dropout(np.float32(0.1))` and `LayerNorm(4, eps=np.float32(1e-6))`
    were refused as 'must be a number in [0, 1)' and 'must be positive',
    `Dropout(seed=np.int64(3))` as not an int."""
    layers = [
        LayerNorm(4, eps=np.float32(1e-6)),
        Dropout(np.float32(0.25), seed=np.int64(3)),
        Dropout(np.float64(0.5), seed=np.uint32(7)),
    ]
    for layer in layers:
        config = json.loads(json.dumps(layer.config()))
        assert layer_from_config(config).config() == config
    assert gpt(5, 3, n_layer=1, n_head=1, d_model=2, dropout=np.float32(0.1)).layers


@pytest.mark.parametrize(
    ("eps", "needle"),
    [
        (True, "eps must be a real number, got bool"),
        (10**400, "eps must be finite in float64"),
        (0.0, "eps must be positive, got 0.0"),
        ("1e-5", "eps must be a real number, got str"),
    ],
)
def test_layernorm_refuses_an_eps_it_would_not_compute_with(eps: object, needle: str) -> None:
    """`eps=True` built a LayerNorm of eps 1.0; an eps that no dtype holds
    is refused when the layer is built (the dtype's own range is checked
    when a model is: `test_layernorm_eps_is_checked_in_the_models_dtype`)."""
    with pytest.raises(ValueError) as info:
        LayerNorm(4, eps=eps)  # type: ignore[arg-type]
    assert needle in str(info.value)
    with pytest.raises(ValueError, match="eps"):
        layer_from_config({"kind": "layernorm", "d_model": 4, "eps": eps})


@pytest.mark.parametrize(
    ("eps", "needle"),
    [
        (1e-50, "eps=1e-50 rounds to 0 in float32; give 0 or a value >= 1e-45"),
        (1e300, "eps must be finite in float32, got 1e+300"),
    ],
)
def test_layernorm_eps_is_checked_in_the_models_dtype(eps: float, needle: str) -> None:
    """The eps was checked in float32 even in a float64 model (the layer is
    built before the model's dtype is known): a float64 model takes 1e-50
    and 1e300, a float32 model refuses them when built, naming the layer and
    the dtype, also inside a `Residual` and from a config."""
    layers = [Residual([LayerNorm(4, eps=eps)]), Linear(4, 2)]
    wide = Sequential(layers, (4,), dtype=np.float64)
    assert wide.layers[0].layers[0].eps == eps
    out = wide.forward(np.ones((2, 4)))
    assert np.isfinite(out).all()
    for build in (
        lambda: Sequential(layers, (4,), dtype=np.float32),
        lambda: Sequential.from_config({**wide.config(), "dtype": "float32"}, wide.get_params()),
        lambda: Sequential.from_layers(layers, (4,), wide.get_params().astype(np.float32)),
    ):
        with pytest.raises(ValueError) as info:
            build()
        assert f"LayerNorm cannot compute in float32: {needle}" in str(info.value)
    again = Sequential.from_config(wide.config(), wide.get_params())
    np.testing.assert_array_equal(again.get_params(), wide.get_params())


@pytest.mark.parametrize("seed", [-1, 2**32, 2**64, True, 1.0])
def test_dropout_refuses_seeds_its_kernel_cannot_draw_from(seed: object) -> None:
    """2**64 failed at the first Step with an OverflowError inside the
    kernel, and 2**32 + 1 silently drew seed 1's masks."""
    with pytest.raises(ValueError, match=r"seed must be an int in \[0, 2\*\*32\)"):
        Dropout(0.5, seed=seed)  # type: ignore[arg-type]
    assert Dropout(0.5, seed=2**32 - 1).seed == 2**32 - 1


@pytest.mark.parametrize("seed", [2**32 - 1, 2**40])
def test_a_gpt_with_dropout_takes_any_seed_its_initialisation_takes(seed: int) -> None:
    """gpt seeds block i's dropouts with seed + 2i and seed + 2i + 1: from
    2**32 - 2 * n_layer up they were refused with a message about a seed
    the caller never passed, while the same seed without dropout built."""
    model = gpt(5, 3, n_layer=2, n_head=1, d_model=2, dropout=0.1, seed=seed)
    drops = [a for layer in model.layers if isinstance(layer, Residual) for a in layer.layers]
    seeds = [a.seed for a in drops if isinstance(a, Dropout)]
    assert seeds == [(seed + k) % 2**32 for k in range(4)]
    assert model.seed == seed
    ref = gpt(5, 3, n_layer=2, n_head=1, d_model=2, seed=seed)
    np.testing.assert_array_equal(model.get_params(), ref.get_params())


def _nested(depth: int) -> dict[str, Any]:
    config: dict[str, Any] = {"kind": "activation", "name": "relu"}
    for _ in range(depth):
        config = {"kind": "residual", "layers": [config]}
    return config


def test_layer_configs_nest_only_so_deep() -> None:
    """A checkpoint's config of 450 nested residuals ended in a RecursionError;
    a cyclic one (built in Python) recursed for ever."""
    limit = registry.MAX_NESTING
    assert isinstance(layer_from_config(_nested(limit - 1)), Residual)
    with pytest.raises(ValueError, match=f"nested more than {limit} deep"):
        layer_from_config(_nested(450))
    cyclic: dict[str, Any] = {"kind": "residual", "layers": []}
    cyclic["layers"].append(cyclic)
    with pytest.raises(ValueError, match="nested more than"):
        layer_from_config(cyclic)
    assert isinstance(layer_from_config(_nested(2)), Residual)  # the depth was given back


@register_layer
class NeedsWidth(Layer):
    """A layer whose own `from_config` reads a key it assumes is there."""

    kind = "needs-width-test"

    def __init__(self, width: int) -> None:
        self.width = width

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> NeedsWidth:
        return cls(config["width"])

    def param_shapes(self) -> list[tuple[int, ...]]:
        return []

    def init_params(self, rng: np.random.Generator) -> list[np.ndarray]:
        return []

    def out_shape(self, in_shape: tuple[int, ...]) -> tuple[int, ...]:
        return in_shape

    def forward(self, be: Any, params: list[Any], x: Any, ctx: ForwardContext) -> tuple[Any, Any]:
        return x, None

    def backward(self, be, params, grads, saved, dy, accumulate, input_grad) -> Any:  # noqa: ANN001
        return dy

    def config(self) -> dict[str, Any]:
        return {"kind": self.kind, "width": self.width}


def test_a_layer_config_that_does_not_build_raises_value_error_naming_the_layer() -> None:
    """A layer's own from_config that raised KeyError (or TypeError) came out as is."""
    with pytest.raises(ValueError, match="layer 'needs-width-test': KeyError: 'width'"):
        layer_from_config({"kind": "needs-width-test"})
    with pytest.raises(ValueError, match="a layer config is a dict with a 'kind', got 5"):
        layer_from_config(5)
    with pytest.raises(ValueError, match=r"p must be a number in \[0, 1\), got False"):
        Dropout(False)  # type: ignore[arg-type]
    assert layer_from_config({"kind": "needs-width-test", "width": 3}).config()["width"] == 3
