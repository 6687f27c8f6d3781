"""The rule of sizes (`atomr._arguments`): a size or count no array could
hold (beyond `INDEX_MAX`, NumPy's `np.intp`) is refused with a ValueError
naming the argument, its value and the limit, before anything is
allocated; a merely large one is tried, and a MemoryError names what was
being built and its bytes."""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from atomr._arguments import INDEX_MAX, array_bytes, building, int_at_least, sequence_entries
from atomr.accel import cpu_devices
from atomr.actor import Actor, Props, RoundRobinPool
from atomr.train import (
    AsyncParameterServer,
    DataParallelOptions,
    LossKind,
    Mlp,
    OptimizerKind,
    ParameterServerOptions,
    PipelineOptions,
    TrainerConfig,
    fit,
)
from atomr.train.comm.mpi.job import DistributedTrainConfig
from atomr.train.core.data import epoch_order, synthetic_classification
from atomr.train.core.model import Sequential
from atomr.train.core.model.gpt import gpt
from atomr.train.core.model.linear import Linear
from atomr.train.core.model.transformer import CausalSelfAttention, Embedding, LayerNorm
from atomr.train.core.sources import InvalidDataError, as_source, batch_bounds
from atomr.train.data_parallel import SpeedBalancer
from atomr.train.parameter_server import Consistency, TrainEpochs

INT64_MAX = int(np.iinfo(np.int64).max)
BEYOND = [10**30, INDEX_MAX + 1]
"""Sizes no index type holds."""

_X, _Y = np.zeros((4, 2), dtype=np.float32), np.zeros(4, dtype=np.int64)
_CONFIG = dict(optimizer=OptimizerKind.sgd(0.1), loss=LossKind.CROSS_ENTROPY)

# name -> build with the count (each refuses one beyond INDEX_MAX, naming it)
COUNTS: dict[str, tuple[Callable[[Any], Any], str]] = {
    "Mlp sizes": (lambda v: Mlp([v, 2]), "sizes[0]"),
    "Linear": (lambda v: Linear(v, 2), "in_features"),
    "Embedding": (lambda v: Embedding(v, 4, 4), "vocab"),
    "LayerNorm": (lambda v: LayerNorm(v), "d_model"),
    "attention heads": (lambda v: CausalSelfAttention(4, v), "n_head"),
    "gpt n_layer": (lambda v: gpt(8, 4, n_layer=v, n_head=1, d_model=4), "n_layer"),
    "accumulation_steps": (lambda v: TrainerConfig(**_CONFIG, accumulation_steps=v), "accum"),
    "max_steps": (lambda v: TrainerConfig(**_CONFIG, max_steps=v), "max_steps"),
    "workers": (lambda v: ParameterServerOptions(workers=v), "workers"),
    "shards": (lambda v: ParameterServerOptions(shards=v), "shards"),
    "max_staleness": (lambda v: ParameterServerOptions(max_staleness=v), "max_staleness"),
    "micro_batch_size": (lambda v: PipelineOptions(micro_batch_size=v), "micro_batch_size"),
    "average_every": (lambda v: DataParallelOptions(average_every=v), "average_every"),
    "batch_size": (lambda v: batch_bounds(10, v), "batch_size"),
    "samples": (lambda v: synthetic_classification(v, 4, 2), "n"),
    "epoch_order": (lambda v: epoch_order(v, 0, 0), "n"),
    "bounded staleness": (lambda v: Consistency.bounded(v), "s"),
    "TrainEpochs epochs": (lambda v: TrainEpochs(_X, _Y, epochs=v, batch_size=2), "epochs"),
    "TrainEpochs batch_size": (lambda v: TrainEpochs(_X, _Y, epochs=1, batch_size=v), "batch_size"),
    "fit epochs": (lambda v: asyncio.run(fit(None, (_X, _Y), epochs=v, batch_size=2)), "epochs"),
    "fit batch_size": (lambda v: asyncio.run(fit(None, (_X, _Y), epochs=1, batch_size=v)), "batch"),
    "nr_of_instances": (lambda v: RoundRobinPool(v, Props(Actor)), "nr_of_instances"),
}


@pytest.mark.parametrize("site", list(COUNTS))
@pytest.mark.parametrize("value", BEYOND, ids=["1e30", "intp max + 1"])
def test_a_count_beyond_the_index_type_is_refused_naming_it_and_the_limit(
    site: str, value: int
) -> None:
    build, name = COUNTS[site]
    with pytest.raises(
        ValueError, match=rf"{re.escape(name)}\w* must be <= {INDEX_MAX}, got {value}"
    ):
        build(value)


def test_the_limit_is_what_numpys_index_type_holds() -> None:
    assert INDEX_MAX == np.iinfo(np.intp).max == sys.maxsize


def test_int_at_least_takes_the_limit_and_no_limit_for_a_seed() -> None:
    assert int_at_least("n", INDEX_MAX) == INDEX_MAX
    assert int_at_least("n", np.int64(INT64_MAX)) == INT64_MAX
    with pytest.raises(ValueError, match=r"n must be <= 5, got 6"):
        int_at_least("n", 6, high=5)
    assert int_at_least("seed", 2**128, 0, high=None) == 2**128  # numpy takes 128-bit seeds
    assert Mlp([2, 2], seed=2**128).seed == 2**128


@pytest.mark.parametrize(
    "check",
    [
        lambda v: int_at_least("step", v, 0),
        lambda v: DistributedTrainConfig(world_size=v),
        lambda v: DistributedTrainConfig(world_size=2, rank=v),
        lambda v: DistributedTrainConfig(world_size=2, local_world_size=-v),
    ],
    ids=["int_at_least", "world_size", "rank", "local_world_size"],
)
def test_a_count_far_below_its_floor_is_shown_bounded(check: Callable[[int], Any]) -> None:
    """A header's step of -10**4000 gave a 4,050-character CheckpointError:
    only a count above the limit was shown bounded."""
    with pytest.raises(ValueError) as refused:
        check(-(10**4000))
    assert len(str(refused.value)) < 400


@pytest.mark.parametrize("length", [10**18, INT64_MAX, 10**30])
def test_a_range_too_long_to_list_is_refused_before_listing(length: int) -> None:
    """`sequence_entries(range(10**18))` raised a bare MemoryError (10**30:
    OverflowError), after trying to list it."""
    with pytest.raises(ValueError, match=rf"sizes.*{INDEX_MAX}"):
        sequence_entries("sizes", range(length), "ints")
    with pytest.raises(ValueError, match=rf"sizes.*{INDEX_MAX}"):
        Mlp(range(1, length))
    with pytest.raises(ValueError, match=rf"class_weights.*{INDEX_MAX}"):
        LossKind.weighted_cross_entropy(range(length))


def test_array_bytes_names_the_array_its_bytes_and_the_limit() -> None:
    assert array_bytes("x", INDEX_MAX // 8, 8) == INDEX_MAX // 8 * 8
    with pytest.raises(ValueError, match=rf"^x: {2**61} items of 4 bytes need {2**63} bytes, "):
        array_bytes("x", 2**61, 4)


def test_building_names_what_was_built_and_chains_the_memory_error() -> None:
    original = MemoryError("numpy's")
    with (
        pytest.raises(MemoryError, match=r"building the x \(12 bytes needed\)") as caught,
        building("the x", 12),
    ):
        raise original
    assert caught.value.__cause__ is original


# model -> build with a width (a parameter vector of more bytes than an array holds)
MODELS: dict[str, Callable[[int], Any]] = {
    "Mlp": lambda w: Mlp([w, w]),
    "Mlp float64": lambda w: Mlp([w, w], dtype=np.float64),
    "Sequential": lambda w: Sequential([Linear(w, w)], [w]),
    "gpt vocab": lambda w: gpt(w, 4, n_layer=1, n_head=1, d_model=w),
    "gpt context": lambda w: gpt(8, w, n_layer=1, n_head=1, d_model=w),
    "gpt d_model": lambda w: gpt(8, 4, n_layer=1, n_head=1, d_model=w),
}


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("width", [2**31, 10**18, INT64_MAX])
def test_a_model_no_array_could_hold_is_refused_before_any_allocation(
    model: str, width: int
) -> None:
    """Each size fits the index type, their product does not: NumPy said
    "Maximum allowed dimension exceeded" or "array is too big", or raised
    a bare MemoryError, after building every layer. (A GPT's 4 * d_model
    wide layer may be refused first, naming its width and the limit.)"""
    with pytest.raises(ValueError, match=rf"(parameters.* more than the|must be <=) {INDEX_MAX}"):
        MODELS[model](width)


def test_gpt_refuses_too_many_blocks_before_building_them() -> None:
    """`gpt(n_layer=10**18)` built blocks until memory ran out."""
    with pytest.raises(ValueError, match=rf"a GPT's parameters: .* than the {INDEX_MAX}"):
        gpt(8, 4, n_layer=10**18, n_head=1, d_model=4)


@pytest.mark.parametrize("kind", ["Mlp", "Sequential"])
def test_a_model_too_large_for_memory_names_itself_in_the_memory_error(kind: str) -> None:
    """2**59 float32 parameters (2**61 bytes) fit the index type and no
    machine's address space: NumPy's MemoryError is raised again naming the
    model and its bytes, the original chained."""
    n = 2**29 * 2**30 + 2**30
    with pytest.raises(MemoryError) as caught:
        if kind == "Mlp":
            Mlp([2**29, 2**30])
        else:
            Sequential([Linear(2**29, 2**30)], [2**29])
    message = str(caught.value)
    assert f"{kind} parameters and gradients ({n} float32 each)" in message
    assert f"({2 * 4 * n} bytes needed)" in message
    assert isinstance(caught.value.__cause__, MemoryError)


def test_cpu_devices_refuses_more_than_a_list_holds_before_making_any() -> None:
    """`cpu_devices(10**18)` made devices until memory ran out."""
    with pytest.raises(ValueError, match=rf"a list of {10**18} cpu devices: .* {INDEX_MAX}"):
        cpu_devices(10**18)
    assert [str(d) for d in cpu_devices(2)] == ["cpu:0", "cpu:1"]


def test_the_seed_of_trainepochs_has_no_upper_limit() -> None:
    assert TrainEpochs(_X, _Y, epochs=1, batch_size=2, seed=2**128).seed == 2**128


def test_a_speed_balancer_for_more_replicas_than_memory_names_its_speeds() -> None:
    """`SpeedBalancer(10**18, min_share=0)` raised NumPy's bare MemoryError
    ("array is too big" for 2**63 - 1)."""
    with pytest.raises(MemoryError, match=rf"the speeds of {10**18} replicas \({8 * 10**18} b"):
        SpeedBalancer(10**18, min_share=0.0)
    with pytest.raises(ValueError, match=rf"the speeds of {INDEX_MAX} replicas: .* {INDEX_MAX}"):
        SpeedBalancer(INDEX_MAX, min_share=0.0)


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        (ParameterServerOptions(workers=10**18), rf"the model replicas of {10**18} workers: "),
        (ParameterServerOptions(shards=10**18), rf"cannot split 6 values into {10**18} ranges"),
    ],
    ids=["workers", "shards"],
)
def test_a_parameter_server_refuses_counts_its_model_cannot_take_before_listing_devices(
    options: ParameterServerOptions, needle: str
) -> None:
    """10**18 workers or shards had a device listed for each first, until
    memory ran out."""
    config = TrainerConfig(**_CONFIG)
    with pytest.raises(ValueError, match=needle):
        AsyncParameterServer.props(Mlp([2, 2]), ["cpu:0"], config, options)


class _Endless:
    """A map-style dataset that says it has 10**30 samples."""

    def __len__(self) -> int:
        return 10**30

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        return np.zeros(2, dtype=np.float32), 0


def test_a_dataset_longer_than_an_index_is_refused_naming_the_limit() -> None:
    """`len()` raised its own OverflowError ("cannot fit 'int' into an
    index-sized integer"), naming neither the set nor the limit."""
    with pytest.raises(InvalidDataError, match=rf"train: len\(dataset\) is more than {INDEX_MAX}"):
        as_source("train", _Endless(), batch_size=2, seed=0)


def test_optimizer_state_is_checked_and_named_like_a_models_parameters() -> None:
    """Adam's two moments of 2**61 float32 were NumPy's "array is too big",
    of 2**59 its bare MemoryError."""
    adam = OptimizerKind.adam(0.1)
    with pytest.raises(ValueError, match=rf"adam optimizer state \(2 x {2**61} float32\): "):
        adam.create(2**61)
    with pytest.raises(MemoryError, match=rf"adam optimizer state \(2 x {2**59} float32\) \("):
        adam.create(2**59)
