"""A checkpoint's numbers are checked in the dtype they are used in: a float64
model's weights and Adam moments beyond float32's range (1e39, legal in
float64) save and load bit-exactly with every strategy; a float32 trainer
refuses such a file with a `CheckpointError` naming what does not fit, and
keeps its weights, step and optimizer state."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atomr import ActorRef, ActorSystem
from atomr.accel import cpu_devices
from atomr.train import (
    CheckpointError,
    GetWeights,
    LoadCheckpoint,
    LossKind,
    Mlp,
    OptimizerKind,
    SaveCheckpoint,
    Step,
    TrainerConfig,
    load_checkpoint,
)
from atomr.train.core import Checkpoint, save_checkpoint, synthetic_classification
from atomr.train.core.checkpoint import check_model_matches
from atomr.train.parameter_server.messages import PullWeights, PushGradient
from atomr.train.parameter_server.server import ServerShard
from tests.train.test_contract import STRATEGIES

ADAM = TrainerConfig(OptimizerKind.adam(0.01), LossKind.CROSS_ENTROPY)
F32_MAX = float(np.finfo(np.float32).max)
X, Y = synthetic_classification(32, 6, 3, seed=6)


def _huge_model(dtype: Any) -> Mlp:
    """A model with a weight of 1e39 and one of -1e39 (infinite in float32)."""
    model = Mlp([6, 8, 3], seed=4, dtype=dtype)
    params = model.get_params()
    params[0], params[-1] = 1e39, -1e39
    model.set_params(params)
    return model


@pytest.mark.parametrize("strategy", list(STRATEGIES))
async def test_a_float64_checkpoint_beyond_float32s_range_round_trips_bit_exactly(
    strategy: str, tmp_path: Path
) -> None:
    """Weights of 1e39 and, after a step on features of 1e20, Adam moments
    far beyond float32's range: saved as float64, loaded back exactly (a
    second step in between is undone), and saved again unchanged."""
    trainer_class, options, n = STRATEGIES[strategy]
    async with ActorSystem("ckdtype") as system:
        ref = await trainer_class.spawn(
            system, _huge_model(np.float64), cpu_devices(n), ADAM, options
        )
        await ref.ask(Step(X.astype(np.float64) * 1e20, Y))
        trained = await ref.ask(GetWeights())
        await ref.ask(SaveCheckpoint(tmp_path / "c.ckpt"))
        await ref.ask(Step(X.astype(np.float64), Y))
        await ref.ask(LoadCheckpoint(tmp_path / "c.ckpt"))
        reloaded = await ref.ask(GetWeights())
        await ref.ask(SaveCheckpoint(tmp_path / "again.ckpt"))
    saved, again = load_checkpoint(tmp_path / "c.ckpt"), load_checkpoint(tmp_path / "again.ckpt")
    assert saved.weights.dtype == np.float64 and np.abs(saved.weights).max() >= 1e39
    assert np.abs(saved.optimizer["exp_avg_sq"]).max() > F32_MAX
    np.testing.assert_array_equal(saved.weights, trained)
    np.testing.assert_array_equal(reloaded, trained)
    for key in ("exp_avg", "exp_avg_sq"):
        assert saved.optimizer[key].dtype == np.float64
        np.testing.assert_array_equal(again.optimizer[key], saved.optimizer[key])


async def _state(ref: ActorRef, path: Path) -> Checkpoint:
    await ref.ask(SaveCheckpoint(path))
    return load_checkpoint(path)


@pytest.mark.parametrize("strategy", list(STRATEGIES))
async def test_a_float32_trainer_refuses_float64_numbers_beyond_its_range(
    strategy: str, tmp_path: Path
) -> None:
    """Two files that load (`load_checkpoint` takes float64 arrays of 1e39):
    a float64 model's weights (wider than the model: refused whatever their
    values), and the trainer's own checkpoint with a float64 first moment
    holding 1e39 (refused naming the buffer and float32); nothing changes."""
    trainer_class, options, n = STRATEGIES[strategy]
    async with ActorSystem("ckdtype") as system:
        ref = await trainer_class.spawn(
            system, Mlp([6, 8, 3], seed=4), cpu_devices(n), ADAM, options
        )
        await ref.ask(Step(X, Y))
        before = await _state(ref, tmp_path / "before.ckpt")
        exp_avg = before.optimizer["exp_avg"].astype(np.float64)
        exp_avg[1] = 1e39
        moment = Checkpoint(
            **{**before.__dict__, "optimizer": {**before.optimizer, "exp_avg": exp_avg}}
        )
        wide = Checkpoint(**{**before.__dict__, "weights": _huge_model(np.float64).get_params()})
        refusals = {
            "wide": (wide, "checkpoint weights are float64, this model is float32"),
            "moment": (moment, r"'exp_avg' hold values too large for float32"),
        }
        for what, (ckpt, message) in refusals.items():
            save_checkpoint(tmp_path / f"{what}.ckpt", ckpt)
            load_checkpoint(tmp_path / f"{what}.ckpt")  # a valid file
            with pytest.raises(CheckpointError, match=message):
                await ref.ask(LoadCheckpoint(tmp_path / f"{what}.ckpt"))
            after = await _state(ref, tmp_path / "after.ckpt")
            np.testing.assert_array_equal(after.weights, before.weights, what)
            assert after.step == before.step, what
            for key, value in before.optimizer.items():
                np.testing.assert_array_equal(after.optimizer[key], value, what)


def test_load_checkpoint_takes_float64_arrays_beyond_float32s_range(tmp_path: Path) -> None:
    """Checked in the dtype they were saved in; the receiving model decides."""
    model = _huge_model(np.float64)
    weights = model.get_params()
    save_checkpoint(tmp_path / "c.ckpt", Checkpoint(model.config(), weights, 1))
    loaded = load_checkpoint(tmp_path / "c.ckpt")
    assert loaded.weights.dtype == np.float64
    np.testing.assert_array_equal(loaded.weights, weights)
    check_model_matches(loaded, model.config(), model.n_params, model.dtype)
    narrow = Mlp([6, 8, 3], seed=4)
    with pytest.raises(CheckpointError, match="float64, this model is float32"):
        check_model_matches(loaded, narrow.config(), narrow.n_params, narrow.dtype)


@pytest.mark.parametrize("config", [True, False], ids=["model config", "default config"])
async def test_a_lone_server_shard_loads_in_the_dtype_it_holds(
    config: bool, tmp_path: Path
) -> None:
    """A float64 shard saves and loads weights of 1e39 bit-exactly; a float32
    one refuses that checkpoint (it would round its weights), with or without
    a model config (a default one names no dtype), and keeps its state."""
    wide = _huge_model(np.float64)
    kind = OptimizerKind.sgd(0.1)
    async with ActorSystem("ckdtype") as system:
        shards = [
            system.spawn(
                ServerShard.props(
                    model.get_params(),
                    kind,
                    dtype=model.dtype,
                    model_config=model.config() if config else None,
                )
            )
            for model in (wide, Mlp([6, 8, 3], seed=4))
        ]
        await shards[0].ask(SaveCheckpoint(tmp_path / "wide.ckpt"))
        await shards[0].ask(PushGradient(0, 0, np.ones(wide.n_params)))
        await shards[0].ask(LoadCheckpoint(tmp_path / "wide.ckpt"))
        np.testing.assert_array_equal(await shards[0].ask(GetWeights()), wide.get_params())
        before = await shards[1].ask(PullWeights(0))
        with pytest.raises(CheckpointError, match="weights are float64, this model is float32"):
            await shards[1].ask(LoadCheckpoint(tmp_path / "wide.ckpt"))
        after = await shards[1].ask(PullWeights(0))
    np.testing.assert_array_equal(after[0], before[0])
    assert after[1] == before[1] == 0
