"""Models as `Sequential`s: the `Mlp` is one (same layout, same bits as a
hand-built stack of `Linear` and `Activation` layers), a GPT trains with
every trainer that takes any model and equals one device (dropout on), and
configs and checkpoints round-trip."""

from __future__ import annotations

import re
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atomr import ActorSystem
from atomr.accel import cpu_devices
from atomr.train import (
    AsyncParameterServer,
    DataParallelTrainer,
    Evaluate,
    GetWeights,
    InvalidBatchError,
    LoadCheckpoint,
    LossKind,
    Mlp,
    OptimizerKind,
    ParameterServerOptions,
    PipelineOptions,
    PipelineParallelTrainer,
    SaveCheckpoint,
    ShardedDataParallelTrainer,
    ShardedOptions,
    Step,
    TensorParallelTrainer,
    Trainer,
    TrainerConfig,
)
from atomr.train.core.checkpoint import load_checkpoint
from atomr.train.core.model import Activation, Linear, Sequential, gpt
from atomr.train.core.models import batch_spec, model_from_config
from atomr.train.parameter_server import Consistency
from atomr.train.pipeline import Schedule
from atomr.train.pipeline.split import stage_layer_counts

VOCAB, T = 11, 6


def test_an_mlp_is_a_stack_of_linear_and_activation_layers() -> None:
    mlp = Mlp([5, 7, 3], "tanh", seed=4)
    stack = Sequential([Linear(5, 7), Activation("tanh"), Linear(7, 3)], (5,), seed=4)
    np.testing.assert_array_equal(mlp.get_params(), stack.get_params())
    x = np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32)
    np.testing.assert_array_equal(mlp.forward(x), stack.forward(x))
    assert mlp.layer_ranges() == stack.layer_ranges()
    assert [o.stop for o in mlp.layer_offsets()] == [
        r[1] for r in mlp.layer_ranges() if r[1] > r[0]
    ]


def test_views_follow_the_vector_and_keep_only_the_models_own() -> None:
    model = Mlp([3, 4, 2], seed=0)
    other = np.arange(model.n_params, dtype=np.float32)
    np.testing.assert_array_equal(model.views(other, 0)[0], other[:12].reshape(3, 4))
    held = weakref.ref(other)
    del other
    assert held() is None  # a foreign vector's views are not kept
    sets = []
    for k in range(6):  # a double buffer swaps the parameters on every step
        model.params = np.full(model.n_params, float(k), dtype=np.float32)
        sets.append(weakref.ref(model.params))
        assert model.views(model.params, 2)[1].shape == (2,)
        assert np.all(model.views(model.params, 0)[0] == k)
        assert model.views(model.grads, 0)[0].base is model.grads
    assert sum(s() is not None for s in sets) <= 3  # the old parameter sets were let go


def test_each_pass_uses_the_current_parameter_set() -> None:
    """A pass looks the kept views up once (not once per layer): after
    each swap of the parameters, forward, forward_train and backward
    compute with the new set, as a model built from it does."""
    model = Mlp([3, 5, 2], seed=0)
    x = np.random.default_rng(1).random((4, 3), dtype=np.float32)
    d_out = np.ones((4, 2), dtype=np.float32)
    for k in range(5):
        model.params = np.random.default_rng(k).random(model.n_params, dtype=np.float32)
        fresh = Mlp.from_params([3, 5, 2], model.params.copy())
        np.testing.assert_array_equal(model.forward(x), fresh.forward(x))
        tape, fresh_tape = model.forward_train(x), fresh.forward_train(x)
        np.testing.assert_array_equal(tape.output, fresh_tape.output)
        model.backward(tape, d_out)
        fresh.backward(fresh_tape, d_out)
        np.testing.assert_array_equal(model.grads, fresh.grads)


def test_a_config_rebuilds_the_model() -> None:
    model = gpt(VOCAB, T, n_layer=1, d_model=8, n_head=2, dropout=0.1, seed=3)
    rebuilt = model_from_config(model.config(), model.get_params())
    assert rebuilt.config() == {**model.config(), "seed": None}  # built from given weights
    ids = np.random.default_rng(1).integers(0, VOCAB, size=(2, T))
    np.testing.assert_array_equal(rebuilt.forward(ids), model.forward(ids))
    assert isinstance(model_from_config(Mlp([3, 2]).config(), Mlp([3, 2]).get_params()), Mlp)
    with pytest.raises(ValueError):
        model_from_config({"layers": [{"kind": "nope"}]}, np.zeros(0))


def _data(steps: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(7)
    text = rng.integers(0, VOCAB, size=steps * 10 * (T + 1))
    windows = text.reshape(steps, 10, T + 1)
    return [(w[:, :-1].copy(), w[:, 1:].copy()) for w in windows]


CONFIG = TrainerConfig(
    OptimizerKind.sgd(0.3, momentum=0.9), LossKind.CROSS_ENTROPY, gradient_clip=1.0
)
"""SGD, not Adam: the key bias of attention has a gradient of exactly 0 in
exact arithmetic (softmax ignores a shift of a whole row of scores), so its
float gradient is rounding noise, which Adam's normalisation would turn into
steps of size lr that differ between one device and several."""
STRATEGIES: dict[str, tuple[Any, Any, int]] = {
    "data": (DataParallelTrainer, None, 3),
    "zero-2": (ShardedDataParallelTrainer, ShardedOptions(stage=2), 3),
    "zero-3": (ShardedDataParallelTrainer, ShardedOptions(stage=3), 2),
    "tensor": (TensorParallelTrainer, None, 2),
    "pipeline": (PipelineParallelTrainer, PipelineOptions(micro_batch_size=4), 3),
    "ps": (
        AsyncParameterServer,
        ParameterServerOptions(workers=1, consistency=Consistency.synchronous()),
        1,
    ),
}


async def _train(system: ActorSystem, cls: Any, options: Any, n: int, tmp: Path) -> Any:
    model = gpt(VOCAB, T, n_layer=1, d_model=8, n_head=2, dropout=0.2, seed=5)
    devices = ["cpu:0"] if cls is Trainer else cpu_devices(n)
    ref = await cls.spawn(system, model, devices, CONFIG, options)
    losses = [(await ref.ask(Step(x, y))).loss for x, y in _data(6)]
    x, y = _data(1)[0]
    result = await ref.ask(Evaluate(x, y))
    await ref.ask(SaveCheckpoint(tmp))
    return losses, await ref.ask(GetWeights()), result


@pytest.mark.parametrize("strategy", list(STRATEGIES))
async def test_a_gpt_with_dropout_trains_as_on_one_device(strategy: str, tmp_path: Path) -> None:
    cls, options, n = STRATEGIES[strategy]
    async with ActorSystem("gpt") as system:
        ref_losses, ref_weights, ref_eval = await _train(system, Trainer, None, 1, tmp_path / "one")
        losses, weights, evaluation = await _train(system, cls, options, n, tmp_path / "many")
        assert ref_losses[-1] < ref_losses[0]
        np.testing.assert_allclose(losses, ref_losses, rtol=2e-5, atol=1e-6)
        np.testing.assert_allclose(weights, ref_weights, rtol=2e-4, atol=2e-6)
        assert evaluation.accuracy == ref_eval.accuracy
        # the checkpoint holds the GPT's own config: it loads into the other trainer
        same = gpt(VOCAB, T, n_layer=1, d_model=8, n_head=2, dropout=0.2, seed=5)
        single = await Trainer.spawn(system, same, ["cpu:0"], CONFIG)
        await single.ask(LoadCheckpoint(tmp_path / "many"))
        np.testing.assert_array_equal(await single.ask(GetWeights()), weights)


async def test_a_gpt_refuses_bad_tokens_and_a_split_of_its_heads() -> None:
    model = gpt(VOCAB, T, n_layer=1, d_model=8, n_head=2)
    async with ActorSystem("gpt") as system:
        ref = await Trainer.spawn(system, model, ["cpu:0"], CONFIG)
        x, y = _data(1)[0]
        for bad_x, bad_y in [
            (x + VOCAB, y),
            (x[:, :-1], y),
            (x.astype(np.float32), y),
            (x, y[:, :-1]),
        ]:
            with pytest.raises(InvalidBatchError):
                await ref.ask(Step(bad_x, bad_y))
        with pytest.raises(ValueError, match="heads"):
            await TensorParallelTrainer.spawn(system, model, cpu_devices(3), CONFIG)


def test_pipeline_stages_are_cut_at_blocks_balanced_by_cost() -> None:
    model = gpt(VOCAB, T, n_layer=2, d_model=8, n_head=2)
    costs = model.stage_costs()
    assert len(costs) == model.n_layers == 7  # embedding, 2 x 2 residual blocks, norm, head
    counts = stage_layer_counts(model, 3, None)
    assert sum(counts) == 7 and all(c >= 1 for c in counts)
    bounds = np.cumsum([0, *counts])
    largest = max(sum(costs[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True))
    assert (
        largest
        == min(  # no other cut into 3 stages has a smaller largest stage
            max(sum(costs[:i]), sum(costs[i:j]), sum(costs[j:]))
            for i in range(1, 6)
            for j in range(i + 1, 7)
        )
    )
    stage = model.slice_layers(1, 3)
    assert stage.in_shape == (T, 8) and stage.input_kind == "float"
    assert stage.n_params == sum(b - a for a, b in model.layer_ranges()[1:3])


@pytest.mark.parametrize("make", [lambda: Mlp([3, 4, 5, 2]), lambda: gpt(VOCAB, T, n_layer=1)])
@pytest.mark.parametrize(
    ("start", "stop", "error", "needle"),
    [
        (True, 2, TypeError, "start must be an int, got True"),
        (0, np.True_, TypeError, "stop must be an int"),
        (0.5, 2, TypeError, "start must be an int, got 0.5"),
        (0, 2.0, TypeError, "stop must be an int, got 2.0"),
        ("1", 2, TypeError, "start must be an int"),
        (-1, 2, ValueError, "start must be >= 0, got -1"),
        (2, 2, ValueError, "need 0 <= start < stop <= "),
        (2, 1, ValueError, "need 0 <= start < stop <= "),
        (0, 99, ValueError, "need 0 <= start < stop <= "),
    ],
)
def test_slice_layers_refuses_bounds_that_are_no_ints_or_no_layers(
    make: Any, start: Any, stop: Any, error: type, needle: str
) -> None:
    """`slice_layers(True, 2)` was taken as start 1 and `0.5` failed inside
    with "list indices must be integers"; NumPy's ints are ints."""
    model = make()
    with pytest.raises(error, match=re.escape(needle)):
        model.slice_layers(start, stop)
    part = model.slice_layers(np.int64(1), np.int64(2))
    assert part.n_params == model.slice_layers(1, 2).n_params


@pytest.mark.parametrize("n", [1, 2, 4])
async def test_tensor_parallel_gpt_equals_one_device_for_n_shards(n: int, tmp_path: Path) -> None:
    config = TrainerConfig(OptimizerKind.sgd(0.3, momentum=0.9), LossKind.CROSS_ENTROPY)

    def model() -> Sequential:  # 4 heads; the vocabulary of 11 splits unevenly
        return gpt(VOCAB, T, n_layer=1, d_model=8, n_head=4, dropout=0.1, seed=2)

    async with ActorSystem("gpt-tp") as system:
        one = await Trainer.spawn(system, model(), ["cpu:0"], config)
        tp = await TensorParallelTrainer.spawn(system, model(), cpu_devices(n), config)
        for x, y in _data(4):
            a, b = await one.ask(Step(x, y)), await tp.ask(Step(x, y))
            assert b.loss == pytest.approx(a.loss, rel=2e-5)
            assert b.grad_norm == pytest.approx(a.grad_norm, rel=1e-4)
        np.testing.assert_allclose(
            await tp.ask(GetWeights()), await one.ask(GetWeights()), rtol=2e-4, atol=2e-6
        )
        with pytest.raises(ValueError, match="cannot split 4 attention heads"):
            await TensorParallelTrainer.spawn(system, model(), cpu_devices(3), config)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
async def test_pipeline_gpt_equals_one_device_with_uneven_micro_batches(schedule: str) -> None:
    config = TrainerConfig(OptimizerKind.sgd(0.3, momentum=0.9), LossKind.CROSS_ENTROPY)

    def model() -> Sequential:
        return gpt(VOCAB, T, n_layer=2, d_model=8, n_head=2, dropout=0.1, seed=3)

    options = PipelineOptions(micro_batch_size=3, schedule=Schedule.parse(schedule))  # 10 = 3+3+3+1
    async with ActorSystem("gpt-pp") as system:
        one = await Trainer.spawn(system, model(), ["cpu:0"], config)
        pipe = await PipelineParallelTrainer.spawn(system, model(), cpu_devices(3), config, options)
        for x, y in _data(4):
            a, b = await one.ask(Step(x, y)), await pipe.ask(Step(x, y))
            assert b.loss == pytest.approx(a.loss, rel=2e-5)
        np.testing.assert_allclose(
            await pipe.ask(GetWeights()), await one.ask(GetWeights()), rtol=2e-4, atol=2e-6
        )


def _per_position_model() -> Sequential:
    """A float model of per-sample shape (5, 4): the same MLP on each of 5
    positions, a class per position."""
    return Sequential([Linear(4, 8), Activation("tanh"), Linear(8, 3)], (5, 4), seed=1)


@pytest.mark.parametrize("strategy", ["data", "zero-2", "zero-3", "pipeline", "ps"])
async def test_a_float_model_of_several_input_axes_trains_as_on_one_device(
    strategy: str,
) -> None:
    cls, options, n = STRATEGIES[strategy]
    n = min(n, 2)  # two of its three layers hold parameters: at most two stages
    rng = np.random.default_rng(0)
    batches = [
        (rng.standard_normal((12, 5, 4)).astype(np.float32), rng.integers(0, 3, (12, 5)))
        for _ in range(3)
    ]
    async with ActorSystem("shaped") as system:
        single = await Trainer.spawn(system, _per_position_model(), "cpu:0", CONFIG)
        many = await cls.spawn(system, _per_position_model(), cpu_devices(n), CONFIG, options)
        for x, y in batches:
            want = await single.ask(Step(x, y))
            got = await many.ask(Step(x, y))
            assert got.loss == pytest.approx(want.loss, rel=1e-5)
        want_w = await single.ask(GetWeights())
        np.testing.assert_allclose(await many.ask(GetWeights()), want_w, rtol=1e-4, atol=1e-6)
        x, y = batches[0]
        if strategy == "ps":  # a batch smaller than the workers: one gets an empty part
            ps = await cls.spawn(
                system,
                _per_position_model(),
                cpu_devices(2),
                CONFIG,
                ParameterServerOptions(workers=3, consistency=Consistency.synchronous()),
            )
            assert (await ps.ask(Step(x[:2], y[:2]), timeout=30)).applied
        result = await many.ask(Evaluate(x, y))
        assert result.samples == 12
        assert result.accuracy == (await single.ask(Evaluate(x, y))).accuracy
        # features of another rank or per-sample shape, targets per sample: refused
        before = await many.ask(GetWeights())
        for bad_x, bad_y in [(x[:, 0], y[:, 0]), (x[:, :, :3], y), (x, y[:, 0]), (x[..., None], y)]:
            with pytest.raises(InvalidBatchError):
                await many.ask(Step(bad_x, bad_y))
        np.testing.assert_array_equal(await many.ask(GetWeights()), before)


def test_a_token_model_needs_a_first_layer_that_says_its_vocabulary() -> None:
    with pytest.raises(ValueError, match="needs a first layer that says its vocabulary"):
        Sequential([Linear(4, 3)], (4,), input_kind="tokens")
    config = gpt(VOCAB, T, n_layer=1, d_model=8, n_head=2).config()
    config["layers"][0] = Linear(4, 3).config()
    with pytest.raises(ValueError, match="Linear has None"):
        batch_spec(config)


def test_a_model_called_directly_names_the_input_shape_it_takes() -> None:
    """A GPT given fewer tokens than its context (or an MLP the wrong width)
    is refused before any layer runs, naming the model's input shape."""
    model = gpt(7, 6, n_layer=1, n_head=2, d_model=4)
    tokens = np.zeros((2, 3), dtype=np.int64)
    with pytest.raises(ValueError, match=r"inputs of shape \(batch, 6\), got \(2, 3\)"):
        model.forward(model.backend.to_device(tokens))
    with pytest.raises(ValueError, match=r"\(batch, 6\), got \(2, 3\)"):
        model.forward_train(model.backend.to_device(tokens))
    mlp = Sequential([Linear(4, 3)], input_shape=(4,))
    with pytest.raises(ValueError, match=r"\(batch, 4\), got \(5, 3\)"):
        mlp.forward(np.zeros((5, 3), np.float32))
    assert mlp.forward(np.zeros((5, 4), np.float32)).shape == (5, 3)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"n_layer": 0}, "n_layer must be a positive int, got 0"),
        ({"n_layer": -1}, "n_layer must be a positive int, got -1"),
        ({"n_layer": True}, "n_layer must be a positive int, got True"),
        ({"n_layer": 1.5}, "n_layer must be a positive int, got 1.5"),
        ({"n_head": 0}, "n_head must be a positive int, got 0"),
        ({"d_model": 2.0}, "d_model must be a positive int, got 2.0"),
        ({"vocab": -5}, "vocab must be a positive int, got -5"),
        ({"context": "4"}, "context must be a positive int, got '4'"),
        ({"dropout": -0.5}, "dropout must be a number in [0, 1), got -0.5"),
        ({"dropout": float("nan")}, "dropout must be a number in [0, 1), got nan"),
        ({"dropout": 1.0}, "dropout must be a number in [0, 1), got 1.0"),
    ],
)
def test_gpt_refuses_a_size_or_dropout_out_of_range_naming_it(
    kwargs: dict[str, Any], needle: str
) -> None:
    """n_layer 0 or -1 built a model of no blocks, True one block, and a
    negative or NaN dropout none: all without a word."""
    args = {"vocab": 5, "context": 4, "n_layer": 1, "n_head": 1, "d_model": 4, **kwargs}
    with pytest.raises(ValueError) as info:
        gpt(**args)
    assert needle in str(info.value)


@pytest.mark.parametrize(
    "make",
    [
        lambda seed: Mlp([3, 2], seed=seed),
        lambda seed: Sequential([Linear(3, 2)], (3,), seed=seed),
        lambda seed: gpt(5, 4, n_layer=1, n_head=1, d_model=4, dropout=0.1, seed=seed),
    ],
    ids=["mlp", "sequential", "gpt"],
)
@pytest.mark.parametrize(
    ("seed", "error"), [(True, TypeError), (1.5, TypeError), ("1", TypeError), (-1, ValueError)]
)
def test_a_models_seed_must_be_an_int_at_least_0(make: Any, seed: object, error: type) -> None:
    """`seed=True` drew the model of seed 1 (and its config said 1); a float,
    a str or a negative seed failed inside NumPy, without the word seed."""
    with pytest.raises(error, match="seed must be"):
        make(seed)


@pytest.mark.parametrize(
    ("shape", "needle"),
    [
        ((4.7,), "input_shape[0] must be a positive int, got 4.7"),
        ((-3,), "input_shape[0] must be a positive int, got -3"),
        ((0,), "input_shape[0] must be a positive int, got 0"),
        ((2, True), "input_shape[1] must be a positive int, got True"),
        (4, "input_shape must be a list, tuple or 1-D array of positive ints, got 4"),
        ((), "input_shape must have at least one axis"),
    ],
)
def test_a_sequential_refuses_an_input_shape_that_is_not_positive_ints(
    shape: object, needle: str
) -> None:
    """(4.7,) was truncated to (4,), and (-3,) or (0,) kept as they were."""
    with pytest.raises(ValueError) as info:
        Sequential([Activation("relu")], shape)  # type: ignore[arg-type]
    assert needle in str(info.value)
    assert Sequential([Activation("relu")], np.array([3])).in_shape == (3,)


LINEAR = {"kind": "linear", "in_features": 2, "out_features": 2}


def _nested_residuals(depth: int) -> dict[str, Any]:
    layer: dict[str, Any] = {"kind": "activation", "name": "relu"}
    for _ in range(depth):
        layer = {"kind": "residual", "layers": [layer]}
    return {"layers": [layer], "input_shape": [2]}


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        ({}, "needs 'sizes' (an Mlp's) or 'layers' (a Sequential's)"),
        ({"sizes": 5}, "sizes must be a list, tuple or 1-D array of positive ints, got 5"),
        ({"sizes": [2, None]}, "sizes[1] must be a positive int, got None"),
        ({"sizes": []}, "sizes must have >= 2 entries"),
        ({"sizes": [2, 2], "activate_last": "false"}, "activate_last must be True or False"),
        ({"sizes": [2, 2], "activation": 5}, "unknown activation 5"),
        ({"layers": []}, "non-empty list of Layers"),
        ({"layers": 5, "input_shape": [2]}, "needs a 'layers' list"),
        (
            {"layers": [LINEAR]},
            "input_shape must be a list, tuple or 1-D array of positive ints, got None",
        ),
        ({"layers": [LINEAR], "input_shape": 5}, "input_shape must be a list"),
        ({"layers": [LINEAR], "input_shape": [[2]]}, "input_shape[0] must be a positive int"),
        ({"layers": [LINEAR], "input_shape": [2.9]}, "input_shape[0] must be a positive int"),
        ({"layers": [LINEAR], "input_shape": [2], "dtype": 5}, "dtype must be float32"),
        ({"layers": [LINEAR], "input_shape": [2], "input_kind": 3}, "input_kind must be one of"),
        ({"layers": [{"kind": "conv9d"}], "input_shape": [2]}, "unknown layer kind 'conv9d'"),
        ({"layers": [{"kind": "linear"}], "input_shape": [2]}, "layer 'linear': TypeError"),
        ({"layers": [[LINEAR]], "input_shape": [2]}, "a layer config is a dict with a 'kind'"),
        (_nested_residuals(450), "nested more than"),
    ],
)
def test_a_config_that_does_not_build_raises_value_error_naming_what_is_wrong(
    config: dict[str, Any], needle: str
) -> None:
    """A checkpoint's config (only checked to be a dict when the file is
    read) raised KeyError, TypeError, IndexError or RecursionError from
    inside the builders, or was accepted: a shape of 2.9 as 2, "false" as
    True; batch_spec took a config of no layers."""
    for build in (lambda: model_from_config(config, np.zeros(6)), lambda: batch_spec(config)):
        with pytest.raises(ValueError) as info:
            build()
        assert needle in str(info.value)


@pytest.mark.parametrize(
    ("config", "key", "known"),
    [
        ({"sizes": [2, 2], "activaton": "tanh"}, "'activaton'", "'activation'"),
        ({"layers": [LINEAR], "input_shape": [2], "dtpye": "float64"}, "'dtpye'", "'dtype'"),
        (
            {"layers": [{"kind": "residual", "layers": [LINEAR], "layer": []}], "input_shape": [2]},
            "'layer'",
            "'layers'",
        ),
        ({"layers": [{**LINEAR, "TP": "row"}], "input_shape": [2]}, "'TP'", "'tp'"),
    ],
)
def test_a_config_key_that_no_version_wrote_is_refused_naming_it_and_the_known_ones(
    config: dict[str, Any], key: str, known: str
) -> None:
    """A misspelt key was ignored: `{"sizes": [2, 2], "activaton": "tanh"}`
    built a relu model without a word (a residual's extra key likewise)."""
    for build in (lambda: model_from_config(config, np.zeros(6)), lambda: batch_spec(config)):
        with pytest.raises(ValueError, match="unknown key") as info:
            build()
        assert key in str(info.value) and known in str(info.value)


async def test_the_configs_that_atomr_wrote_still_build(tmp_path: Path) -> None:
    """Every key a `config()` has written is accepted: an Mlp's (one older
    than `activate_last` too), a GPT's (every built-in layer kind) and the
    merged config of a pipeline's checkpoint."""
    older = {"sizes": [3, 4, 2], "activation": "tanh", "dtype": "float32", "seed": 1}
    models = [
        Mlp([3, 4, 2], "gelu", activate_last=True),
        Sequential([Linear(3, 4, tp="row"), Activation("relu")], (3,)),
        gpt(VOCAB, T, n_layer=1, d_model=8, n_head=2, dropout=0.1, seed=3),
    ]
    for config, params in [(older, np.zeros(26)), *((m.config(), m.get_params()) for m in models)]:
        assert model_from_config(config, params).n_params == len(params)
    for model, n in ((Mlp([4, 6, 5, 3], seed=1), 2), (models[2], 3)):
        async with ActorSystem("configs") as system:
            options = PipelineOptions(micro_batch_size=2)
            ref = await PipelineParallelTrainer.spawn(
                system, model, cpu_devices(n), CONFIG, options
            )
            await ref.ask(SaveCheckpoint(str(tmp_path / "p.ckpt")))
        ckpt = load_checkpoint(tmp_path / "p.ckpt")
        rebuilt = model_from_config(ckpt.model, ckpt.weights)
        assert rebuilt.config() == {**model.config(), "seed": None}


def test_a_config_that_is_not_a_dict_raises_type_error() -> None:
    """A list reached Mlp.from_config and failed there on `config["sizes"]`."""
    with pytest.raises(TypeError, match="a model config is a dict, got list"):
        model_from_config([LINEAR], np.zeros(6))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="a model config is a dict, got NoneType"):
        batch_spec(None)  # type: ignore[arg-type]


def test_batch_spec_is_what_the_built_model_takes_and_gives() -> None:
    for model in (
        gpt(VOCAB, T, n_layer=1, d_model=8, n_head=2),
        Mlp([3, 4, 2], activate_last=True, dtype=np.float64),
        Sequential([Linear(3, 5), Activation("tanh")], (2, 3)),
    ):
        spec = batch_spec(model.config())
        assert (spec.in_shape, spec.out_shape) == (model.in_shape, model.out_shape)
        assert (spec.input_kind, spec.dtype) == (model.input_kind, model.dtype)
    assert batch_spec(gpt(VOCAB, T, n_layer=1, d_model=8, n_head=2).config()).vocab == VOCAB


@pytest.mark.parametrize(
    ("params", "error", "needle"),
    [
        (np.ones(9, dtype=bool), TypeError, "params must be real numbers, got dtype bool"),
        (np.ones(9, dtype=complex), TypeError, "got dtype complex128"),
        (np.array(list("123456789")), TypeError, "got dtype <U1"),
        (np.full(9, 1e300), ValueError, "params hold values too large for float32"),
        (np.zeros(8), ValueError, "params has 8 values, the model needs 9"),
        (np.full(9, np.nan), ValueError, "params contain NaN or Inf"),
        (np.r_[np.zeros(8), -np.inf].astype(np.float32), ValueError, "params contain NaN or Inf"),
    ],
)
def test_parameters_that_the_cast_would_change_are_refused(
    params: np.ndarray, error: type, needle: str
) -> None:
    """Bools were taken as 1.0, complex numbers lost their imaginary part
    (with only a warning), 1e300 became inf in float32 (with only a
    RuntimeWarning), and NaN or Inf weights were taken as they were:
    `set_params` and every constructor that takes params."""
    model = Mlp([2, 3], seed=0)
    before = model.get_params()
    with pytest.raises(error) as info:
        model.set_params(params)
    assert needle in str(info.value)
    np.testing.assert_array_equal(model.get_params(), before)
    with pytest.raises(error, match=needle.split(",")[0]):
        Mlp.from_params([2, 3], params)
    with pytest.raises(error, match=needle.split(",")[0]):
        model_from_config(model.config(), params)
    model.set_params(np.full(9, 1e30))  # float64, finite in float32
    assert np.isfinite(model.get_params()).all()


def test_parameters_are_checked_finite_in_the_model_s_dtype() -> None:
    """A float64 model takes 1e300 (finite in its dtype) and refuses NaN
    like a float32 one, keeping its parameters; so does `from_layers`."""
    model = Mlp([2, 3], seed=0, dtype=np.float64)
    model.set_params(np.full(9, 1e300))
    np.testing.assert_array_equal(model.get_params(), np.full(9, 1e300))
    with pytest.raises(ValueError, match="params contain NaN or Inf"):
        model.set_params(np.r_[np.zeros(8), np.nan])
    np.testing.assert_array_equal(model.get_params(), np.full(9, 1e300))
    with pytest.raises(ValueError, match="params contain NaN or Inf"):
        Sequential.from_layers(model.layers, [2], np.full(9, np.nan))
    # weights checked where they came in (a parameter server's pull): length only
    model.set_params(np.full(9, np.nan), checked=False)
    assert np.isnan(model.get_params()).all()
    with pytest.raises(ValueError, match="params has 8 values, the model needs 9"):
        model.set_params(np.zeros(8), checked=False)


@pytest.mark.parametrize("dtype", [bool, np.int64, np.uint8])
def test_a_float_model_called_directly_refuses_features_that_are_no_floats(dtype: Any) -> None:
    """Bools and ints were cast without a word (`Mlp.forward` of a bool
    batch gave the logits of 1.0 and 0.0); the trainers refuse them too."""
    model = Mlp([3, 2], seed=0)
    x = np.ones((2, 3), dtype=dtype)
    want = f"the model takes float32 or float64 features, got {np.dtype(dtype)}"
    with pytest.raises(TypeError, match=want):
        model.forward(x)
    with pytest.raises(TypeError, match="float64 features"):
        model.forward_train(x)
    assert model.forward(x.astype(np.float64)).dtype == np.float32  # a float is cast


@pytest.mark.parametrize("dtype", [np.float16, np.longdouble])
def test_a_float_model_called_directly_refuses_the_floats_a_step_refuses(dtype: Any) -> None:
    """One rule for features (`is_float32_or_64`): float16 (and float128)
    went through `Mlp.forward` cast without a word, while a `Step` refused them."""
    if np.dtype(dtype).itemsize == 8:
        pytest.skip("longdouble is float64 on this platform")
    model = Mlp([3, 2], seed=0)
    x = np.ones((2, 3), dtype=dtype)
    want = f"the model takes float32 or float64 features, got {np.dtype(dtype)}"
    with pytest.raises(TypeError, match=want):
        model.forward(x)
    with pytest.raises(TypeError, match=want):
        model.forward_train(x)
    with pytest.raises(InvalidBatchError, match=f"float32 or float64, got {np.dtype(dtype)}"):
        batch_spec(model.config()).validate(x, np.zeros(2, np.int64), LossKind.CROSS_ENTROPY)
