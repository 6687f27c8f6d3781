"""Mlp: layout, initialisation, forward/backward against NumPy and finite differences."""

from __future__ import annotations

import math

import numpy as np
import pytest

from atomr.train import LossKind, Mlp


def _numpy_forward(sizes, params, x, act=np.tanh):
    pos = 0
    a = x
    for i, (fi, fo) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        w = params[pos : pos + fi * fo].reshape(fi, fo)
        pos += fi * fo
        b = params[pos : pos + fo]
        pos += fo
        a = a @ w + b
        if i < len(sizes) - 2:
            a = act(a)
    return a


def test_layout_and_views() -> None:
    m = Mlp([3, 5, 2], seed=1)
    assert m.n_params == 3 * 5 + 5 + 5 * 2 + 2 == Mlp.param_count([3, 5, 2])
    assert m.params.dtype == np.float32 and m.params.shape == (m.n_params,)
    assert m.params.flags.c_contiguous and m.grads.shape == m.params.shape
    offs = m.layer_offsets()
    assert [(o.w_offset, o.w_shape, o.b_offset, o.b_shape) for o in offs] == [
        (0, (3, 5), 15, (5,)),
        (20, (5, 2), 30, (2,)),
    ]
    assert offs[-1].stop == m.n_params
    # layers are views: writing through a view changes the flat vector
    m.weights(1)[2, 1] = 42.0
    assert m.params[20 + 2 * 2 + 1] == 42.0
    m.bias(0)[4] = -7.0
    assert m.params[19] == -7.0
    assert np.shares_memory(m.grad_weights(0), m.grads)


def test_init_is_deterministic_and_follows_the_spec() -> None:
    sizes = [4, 3, 2]
    m = Mlp(sizes, seed=7)
    rng = np.random.default_rng(7)
    expect = []
    for fi, fo in zip(sizes[:-1], sizes[1:], strict=True):
        bound = 1 / math.sqrt(fi)
        expect.append(rng.uniform(-bound, bound, size=fi * fo))
        expect.append(rng.uniform(-bound, bound, size=fo))
    np.testing.assert_array_equal(m.params, np.concatenate(expect).astype(np.float32))
    np.testing.assert_array_equal(Mlp(sizes, seed=7).params, m.params)
    assert not np.array_equal(Mlp(sizes, seed=8).params, m.params)
    assert np.all(np.abs(m.params[:12]) <= 0.5) and np.all(
        np.abs(m.params[15:21]) <= 1 / math.sqrt(3)
    )


def test_forward_matches_numpy() -> None:
    m = Mlp([6, 8, 5, 3], activation="tanh", seed=2)
    x = np.random.default_rng(0).standard_normal((9, 6)).astype(np.float32)
    out = m.forward(x)
    np.testing.assert_allclose(out, _numpy_forward(m.sizes, m.params, x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("activation", ["relu", "tanh", "gelu", "identity"])
def test_gradient_matches_central_finite_differences(activation) -> None:
    sizes = [5, 7, 6, 4]
    m = Mlp(sizes, activation=activation, seed=3, dtype=np.float64)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 5))
    labels = rng.integers(0, 4, size=8)
    loss = LossKind.weighted_cross_entropy([1.0, 2.0, 0.5, 1.5])

    def value(p: np.ndarray) -> float:
        m.params[:] = p
        return loss.compute(m.forward(x), labels)[0]

    p0 = m.params.copy()
    tape = m.forward_train(x)
    _, d_out = loss.compute(tape.output, labels)
    dx = m.backward(tape, d_out, input_grad=True)
    grads = m.grads.copy()
    h = 1e-6
    num = np.empty_like(p0)
    for i in range(p0.size):
        e = np.zeros_like(p0)
        e[i] = h
        num[i] = (value(p0 + e) - value(p0 - e)) / (2 * h)
    np.testing.assert_allclose(grads, num, rtol=1e-5, atol=1e-8)
    # input gradient too (pipeline stages pass it on)
    m.params[:] = p0
    num_x = np.empty_like(x)
    for idx in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[idx] += h
        xm[idx] -= h
        num_x[idx] = (
            loss.compute(m.forward(xp), labels)[0] - loss.compute(m.forward(xm), labels)[0]
        ) / (2 * h)
    np.testing.assert_allclose(dx, num_x, rtol=1e-5, atol=1e-8)


def test_backward_accumulate_adds() -> None:
    m = Mlp([4, 6, 3], seed=0)
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    tape = m.forward_train(x)
    d = np.ones((5, 3), dtype=np.float32)
    m.backward(tape, d)
    once = m.grads.copy()
    m.backward(tape, d, accumulate=True)
    np.testing.assert_allclose(m.grads, 2 * once, rtol=1e-6)
    m.backward(tape, d)
    np.testing.assert_allclose(m.grads, once, rtol=1e-6)


def test_slice_layers_is_a_pipeline_stage() -> None:
    m = Mlp([6, 8, 7, 5, 3], activation="tanh", seed=4)
    offs = m.layer_offsets()
    x = np.random.default_rng(2).standard_normal((4, 6)).astype(np.float32)
    a, b, c = m.slice_layers(0, 2), m.slice_layers(2, 3), m.slice_layers(3, 4)
    np.testing.assert_array_equal(a.params, m.params[: offs[1].stop])
    np.testing.assert_array_equal(b.params, m.params[offs[2].w_offset : offs[2].stop])
    assert a.sizes == (6, 8, 7) and b.sizes == (7, 5) and c.sizes == (5, 3)
    assert a.activate_last and b.activate_last and not c.activate_last
    np.testing.assert_allclose(c.forward(b.forward(a.forward(x))), m.forward(x), rtol=1e-6)
    assert not np.shares_memory(a.params, m.params)
    with pytest.raises(ValueError):
        m.slice_layers(2, 2)
    with pytest.raises(ValueError):
        m.slice_layers(0, 5)


def test_config_round_trip_and_to_device() -> None:
    m = Mlp([3, 4, 2], activation="gelu", seed=5)
    back = Mlp.from_config(m.config(), m.get_params())
    np.testing.assert_array_equal(back.params, m.params)
    assert back.config() == {**m.config(), "seed": None}
    moved = m.to("cpu:1")
    np.testing.assert_array_equal(moved.params, m.params)
    assert str(moved.device) == "cpu:1" and moved.seed == 5


def test_bad_construction() -> None:
    with pytest.raises(ValueError, match="sizes"):
        Mlp([3])
    with pytest.raises(ValueError, match="sizes"):
        Mlp([3, 0, 2])
    with pytest.raises(ValueError, match="activation"):
        Mlp([3, 2], activation="swish")
    with pytest.raises(ValueError, match="dtype"):
        Mlp([3, 2], dtype=np.int32)
    with pytest.raises(ValueError, match="dtype"):
        Mlp([3, 2], dtype="not-a-dtype")
    with pytest.raises(ValueError, match="values"):
        Mlp.from_params([3, 2], np.zeros(7))
    with pytest.raises(ValueError):
        Mlp([3, 2]).set_params(np.zeros(9))


@pytest.mark.parametrize(
    ("sizes", "needle"),
    [
        ([4, 2.9, 3], "sizes[1] must be a positive int, got 2.9"),
        ([4, True, 3], "sizes[1] must be a positive int, got True"),
        ([4, -2, 3], "sizes[1] must be a positive int, got -2"),
        ([4, 3, None], "sizes[2] must be a positive int, got None"),
        ("43", "sizes must be a list, tuple or 1-D array of positive ints, got '43'"),
        (5, "sizes must be a list, tuple or 1-D array of positive ints, got 5"),
        ([], "sizes must have >= 2 entries, got []"),
    ],
)
def test_sizes_are_positive_ints_named_by_their_index(sizes: object, needle: str) -> None:
    """2.9 was truncated to 2, True taken as 1 and "43" as [4, 3]."""
    with pytest.raises(ValueError) as info:
        Mlp(sizes)  # type: ignore[arg-type]
    assert needle in str(info.value)
    with pytest.raises(ValueError):
        Mlp.from_config({"sizes": sizes}, np.zeros(0))
    assert Mlp(np.array([3, 4, 2])).sizes == (3, 4, 2)  # an int array is a list of ints


@pytest.mark.parametrize("flag", ["no", "false", 1, None])
def test_activate_last_must_be_a_bool(flag: object) -> None:
    """ "no" (and a config's "false") was truthy: the model activated its output."""
    with pytest.raises(ValueError, match="activate_last must be True or False"):
        Mlp([4, 3], activate_last=flag)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="activate_last must be True or False"):
        Mlp.from_config({"sizes": [4, 3], "activate_last": flag}, np.zeros(15))
    assert Mlp([4, 3], activate_last=np.bool_(True)).activate_last is True


@pytest.mark.parametrize(
    ("sizes", "needle"),
    [([2, -3], "sizes[1] must be a positive int, got -3"), ([4], "sizes must have >= 2 entries")],
)
def test_param_count_refuses_sizes_mlp_refuses(sizes: list[int], needle: str) -> None:
    """`param_count([2, -3])` was -9 and `param_count([4])` 0, for models
    that `Mlp` refuses to build."""
    with pytest.raises(ValueError) as info:
        Mlp.param_count(sizes)
    assert needle in str(info.value)
    assert Mlp.param_count(np.array([3, 5, 2])) == 3 * 5 + 5 + 5 * 2 + 2
