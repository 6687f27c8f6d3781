"""The `AsyncParameterServer` trainer actor under the trainer contract: a
program written against the contract alone runs on it and, in synchronous
mode, gives what it gives on the single-device Trainer; the shards and
workers are its children; bad arguments are refused when it is spawned."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atomr.actor import ActorRef
from atomr.train import (
    EvalResult,
    Evaluate,
    GetWeights,
    LoadCheckpoint,
    Mlp,
    OptimizerKind,
    SaveCheckpoint,
    Step,
    StepStats,
    Trainer,
    TrainerConfig,
    load_checkpoint,
)
from atomr.train.parameter_server import (
    AsyncParameterServer,
    Consistency,
    ParameterServerOptions,
    ParameterServerWorker,
)
from tests.train.parameter_server.common import SIZES, T, batches, config, spawn

Spawn = Callable[[], Awaitable[ActorRef]]


async def _program(start: Spawn, tmp_path: Path) -> dict[str, Any]:
    """A user's program, written against the trainer contract only: spawn,
    train, checkpoint, train on, evaluate, read the weights, go back to the
    checkpoint. Returns what it saw."""
    data = list(batches(5, 10, seed=7))
    tmp_path.mkdir()
    trainer = await start()
    seen: dict[str, Any] = {"losses": [], "norms": []}
    for k, (x, y) in enumerate(data):
        stats = await trainer.ask(Step(x, y), timeout=T)
        assert isinstance(stats, StepStats) and stats.applied and stats.samples == 10
        seen["losses"].append(stats.loss)
        seen["norms"].append(stats.grad_norm)
        if k == 1:
            assert await trainer.ask(SaveCheckpoint(tmp_path / "mid.ckpt"), timeout=T) is None
            seen["mid"] = await trainer.ask(GetWeights(), timeout=T)
    seen["eval"] = await trainer.ask(Evaluate(*data[0]), timeout=T)
    assert isinstance(seen["eval"], EvalResult)
    seen["final"] = await trainer.ask(GetWeights(), timeout=T)
    assert isinstance(seen["final"], np.ndarray) and seen["final"].ndim == 1
    assert await trainer.ask(LoadCheckpoint(tmp_path / "mid.ckpt"), timeout=T) is None
    seen["restored"] = await trainer.ask(GetWeights(), timeout=T)
    return seen


@pytest.mark.parametrize(("workers", "shards"), [(1, 1), (3, 1), (3, 2)])
async def test_a_contract_program_gives_on_the_synchronous_parameter_server_what_it_gives_on_the_trainer(  # noqa: E501
    actor_system, tmp_path: Path, workers: int, shards: int
) -> None:
    model = Mlp(SIZES, seed=2)
    cfg = config(OptimizerKind.adam(1e-2))
    options = ParameterServerOptions(
        workers=workers, shards=shards, consistency=Consistency.synchronous()
    )

    def on_trainer() -> Awaitable[ActorRef]:
        return Trainer.spawn(actor_system, model, "cpu:0", cfg)

    def on_parameter_server() -> Awaitable[ActorRef]:
        return AsyncParameterServer.spawn(actor_system, model, ["cpu:0", "cpu:1"], cfg, options)

    want = await _program(on_trainer, tmp_path / "trainer")
    got = await _program(on_parameter_server, tmp_path / "ps")
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-5)
    np.testing.assert_allclose(got["final"], want["final"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["mid"], want["mid"], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got["restored"], got["mid"])
    assert not np.allclose(got["restored"], got["final"])  # the load did change the weights
    assert got["eval"].loss == pytest.approx(want["eval"].loss, rel=1e-5)
    assert got["eval"].accuracy == want["eval"].accuracy and got["eval"].samples == 10
    # the parts' norms, weighted: an upper bound of the whole batch's, equal with one worker
    if workers == 1:
        np.testing.assert_allclose(got["norms"], want["norms"], rtol=1e-5)
    else:
        assert all(g >= w * (1 - 1e-5) for g, w in zip(got["norms"], want["norms"], strict=True))


@pytest.mark.parametrize("shards", [1, 2])
async def test_a_float64_model_trains_in_float64_as_on_the_trainer(
    actor_system, tmp_path: Path, shards: int
) -> None:
    model = Mlp(SIZES, seed=2, dtype=np.float64)
    cfg = config(OptimizerKind.adam(1e-2))
    options = ParameterServerOptions(
        workers=1, shards=shards, consistency=Consistency.synchronous()
    )

    def on_trainer() -> Awaitable[ActorRef]:
        return Trainer.spawn(actor_system, model, "cpu:0", cfg)

    def on_parameter_server() -> Awaitable[ActorRef]:
        return AsyncParameterServer.spawn(actor_system, model, ["cpu:0"], cfg, options)

    want = await _program(on_trainer, tmp_path / "trainer")
    got = await _program(on_parameter_server, tmp_path / "ps")
    for key in ("mid", "final", "restored"):
        assert got[key].dtype == np.float64
        np.testing.assert_allclose(got[key], want[key], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-12)
    saved = load_checkpoint(tmp_path / "ps" / "mid.ckpt")
    assert saved.weights.dtype == np.float64
    assert all(v.dtype == np.float64 for v in saved.optimizer.values() if isinstance(v, np.ndarray))


class _RecordingWorker(ParameterServerWorker):
    """Records its own ref and its server shards' refs when it starts."""

    seen: list[ActorRef] = []

    def pre_start(self) -> Any:
        result = super().pre_start()
        type(self).seen += [self.context.self_ref, *self.client.servers]
        return result


async def test_the_shards_and_workers_are_children_and_stop_with_the_trainer(
    actor_system,
) -> None:
    _RecordingWorker.seen = []
    ps = await spawn(
        actor_system,
        Mlp(SIZES, seed=0),
        ["cpu:0", "cpu:1"],
        config(),
        workers=3,
        shards=2,
        worker_class=_RecordingWorker,
    )
    children = set(_RecordingWorker.seen)
    assert len(children) == 3 + 2 and all(ref.is_alive for ref in children)
    assert actor_system.actors == [ps]  # none of them is a top-level actor
    await ps.stop()
    assert not any(ref.is_alive for ref in children)


async def test_a_message_it_does_not_handle_is_a_type_error(actor_system) -> None:
    ps = await spawn(actor_system, Mlp(SIZES, seed=0), ["cpu:0"], config())
    with pytest.raises(TypeError, match="does not handle str"):
        await ps.ask("hello", timeout=T)
    assert (await ps.ask(Step(*next(batches(1, 4))), timeout=T)).samples == 4


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        (
            (["cpu:0"], 4),
            {},
            TypeError,
            "^config must be a TrainerConfig, got int$",
        ),  # old `workers`
        ((["cpu:0"], None), {}, TypeError, "config must be a TrainerConfig"),
        (("cpu:0", config()), {}, TypeError, "devices must be a sequence"),
        (([], config()), {}, ValueError, "devices"),
        ((["tpu:0"], config()), {}, ValueError, "unknown device"),
        (
            (["cpu:0"], config()),
            {"options": {"workers": 2}},
            TypeError,
            "^AsyncParameterServer: options must be a ParameterServerOptions or None, got dict$",
        ),
        (
            (["cpu:0"], config(accumulation_steps=2)),
            {},
            ValueError,
            "^the parameter-server trainer does not accumulate gradients across Steps, "
            "but config.accumulation_steps is 2",
        ),
        (
            (["cpu:0"], config(gradient_clip=1.0)),
            {"options": ParameterServerOptions(shards=2)},
            ValueError,
            "clipping",
        ),
        (
            (["cpu:0"], config()),
            {"options": ParameterServerOptions(shards=10**6)},
            ValueError,
            "ranges",
        ),
    ],
    ids=[
        "workers-as-config",
        "no-config",
        "one-device-not-a-sequence",
        "no-devices",
        "bad-device",
        "options-not-options",
        "accumulation",
        "clipping-with-shards",
        "more-shards-than-weights",
    ],
)
async def test_spawn_refuses_bad_arguments_before_spawning_anything(
    actor_system, args, kwargs, error, match
) -> None:
    with pytest.raises(error, match=match):
        await AsyncParameterServer.spawn(actor_system, Mlp(SIZES, seed=0), *args, **kwargs)
    with pytest.raises(error, match=match):
        AsyncParameterServer.props(Mlp(SIZES, seed=0), *args, **kwargs)
    assert actor_system.actors == []


async def test_spawn_refuses_something_that_is_not_a_model(actor_system) -> None:
    cfg = TrainerConfig(OptimizerKind.sgd(0.1), config().loss)
    with pytest.raises(
        TypeError, match=r"^model must be a Sequential \(an Mlp, a gpt\(...\), ...\), got list$"
    ):
        await AsyncParameterServer.spawn(actor_system, [64, 32, 10], ["cpu:0"], cfg)
