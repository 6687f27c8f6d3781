"""A checkpoint from one trainer loads into any other for the same model
(docs/training.md, Checkpoints): every strategy saves, every strategy (at
another device count too) loads, and the loaded trainer holds the saver's
weights bit for bit, its step, and its optimizer state and schedule
position: its next `Step` is the saver's next `Step` (exactly when the
loader is the saver's own strategy, to float32 rounding otherwise)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atomr import ActorRef, ActorSystem
from atomr.accel import cpu_devices
from atomr.train import (
    AsyncParameterServer,
    CheckpointError,
    DataParallelTrainer,
    GetWeights,
    LoadCheckpoint,
    LossKind,
    Mlp,
    OptimizerKind,
    ParameterServerOptions,
    PipelineOptions,
    PipelineParallelTrainer,
    SaveCheckpoint,
    SetLearningRate,
    ShardedDataParallelTrainer,
    ShardedOptions,
    Step,
    TensorParallelTrainer,
    Trainer,
    TrainerConfig,
)
from atomr.train.core import GetTrainingState, synthetic_classification
from atomr.train.core.model import Activation, Linear, Sequential
from atomr.train.core.schedule import StepLR
from atomr.train.parameter_server import Consistency

CONFIG = TrainerConfig(
    OptimizerKind.adamw(0.01), LossKind.CROSS_ENTROPY, gradient_clip=1.0, schedule=StepLR(2, 0.5)
)
SIZES = [6, 12, 8, 3]
SYNCHRONOUS_PS = ParameterServerOptions(workers=1, consistency=Consistency.synchronous())

STRATEGIES: dict[str, tuple[Any, Any, int]] = {
    "single": (Trainer, None, 1),
    "data-2": (DataParallelTrainer, None, 2),
    "data-3": (DataParallelTrainer, None, 3),
    "tensor-2": (TensorParallelTrainer, None, 2),
    "tensor-1": (TensorParallelTrainer, None, 1),
    "pipeline-2": (PipelineParallelTrainer, PipelineOptions(micro_batch_size=4), 2),
    "pipeline-3": (PipelineParallelTrainer, PipelineOptions(micro_batch_size=4), 3),
    "ps": (AsyncParameterServer, SYNCHRONOUS_PS, 1),
    **{
        f"zero{stage}{'-files' if files else ''}-{n}": (
            ShardedDataParallelTrainer,
            ShardedOptions(stage=stage, shard_checkpoints=files),
            n,
        )
        for stage in (1, 2, 3)
        for files in (False, True)
        for n in (2, 3)
    },
}
SAVERS = [
    name for name in STRATEGIES if not name.endswith("-3") and name != "tensor-1"
]  # fmt: skip
LOADERS = ["single", "data-3", "tensor-1", "pipeline-3", "ps", "zero1-3", "zero3-files-2"]


def _batch(i: int) -> tuple[np.ndarray, np.ndarray]:
    return synthetic_classification(16, SIZES[0], SIZES[-1], seed=10 + i)


async def _spawn(system: ActorSystem, name: str, seed: int) -> ActorRef:
    trainer_class, options, n = STRATEGIES[name]
    return await trainer_class.spawn(system, Mlp(SIZES, seed=seed), cpu_devices(n), CONFIG, options)


async def _next_step(ref: ActorRef) -> tuple[float, np.ndarray, int]:
    loss = (await ref.ask(Step(*_batch(3)))).loss
    return loss, await ref.ask(GetWeights()), (await ref.ask(GetTrainingState())).step


@pytest.mark.parametrize("saver", SAVERS)
async def test_a_checkpoint_loads_into_every_strategy_and_resumes_its_run(
    saver: str, tmp_path: Path
) -> None:
    path = tmp_path / "saved.ckpt"
    async with ActorSystem("matrix") as system:
        ref = await _spawn(system, saver, seed=0)
        await ref.ask(Step(*_batch(0)))
        await ref.ask(SetLearningRate(0.02))
        for i in (1, 2):
            await ref.ask(Step(*_batch(i)))
        await ref.ask(SaveCheckpoint(path))
        saved = await ref.ask(GetWeights())
        want_loss, want, _ = await _next_step(ref)
        await ref.stop()
        for loader in dict.fromkeys([saver, *LOADERS]):
            ref = await _spawn(system, loader, seed=5)
            await ref.ask(LoadCheckpoint(path))
            np.testing.assert_array_equal(await ref.ask(GetWeights()), saved, err_msg=loader)
            assert (await ref.ask(GetTrainingState())).step == 3, loader
            loss, weights, step = await _next_step(ref)
            assert step == 4, loader
            if loader == saver:
                assert loss == want_loss
                np.testing.assert_array_equal(weights, want)
            else:
                assert loss == pytest.approx(want_loss, rel=1e-5), loader
                np.testing.assert_allclose(weights, want, rtol=1e-5, atol=2e-7, err_msg=loader)
            await ref.stop()


def _layers(seed: int) -> Sequential:
    """Not an `Mlp`: `TensorParallelTrainer` splits it layer by layer."""
    return Sequential([Linear(6, 12), Activation("tanh"), Linear(12, 3)], (6,), seed=seed)


def _mlp(seed: int) -> Mlp:
    return Mlp(SIZES, seed=seed)


REFUSERS: dict[str, tuple[str, Any]] = {
    "single": ("Trainer", _mlp),
    "data-2": ("DataParallelTrainer", _mlp),
    "zero3-2": ("ShardedDataParallelTrainer", _mlp),
    "tensor-2": ("TensorParallelTrainer", _mlp),
    "tensor-layers": ("TensorParallelTrainer", _layers),
    "pipeline-2": ("PipelineParallelTrainer", _mlp),
    "ps": ("AsyncParameterServer", _mlp),
}


async def _refused(ref: ActorRef, path: Path) -> str:
    """`LoadCheckpoint(path)`'s refusal, after checking it changed nothing."""
    weights = await ref.ask(GetWeights())
    step = (await ref.ask(GetTrainingState())).step
    with pytest.raises(CheckpointError) as refusal:
        await ref.ask(LoadCheckpoint(path))
    np.testing.assert_array_equal(await ref.ask(GetWeights()), weights)
    assert (await ref.ask(GetTrainingState())).step == step
    return str(refusal.value)


@pytest.mark.parametrize("loader", list(REFUSERS))
async def test_every_trainer_refuses_another_optimizer_and_an_open_window_alike(
    loader: str, tmp_path: Path
) -> None:
    """A checkpoint of another optimizer kind, and one saved inside a
    gradient accumulation window by a trainer of `accumulation_steps=2`, are
    refused by every trainer (which accumulates 1) with the same message,
    and leave its weights and step as they were."""
    trainer_name, model = REFUSERS[loader]
    sgd = dataclasses.replace(CONFIG, optimizer=OptimizerKind.sgd(0.1))
    windowed = dataclasses.replace(CONFIG, accumulation_steps=2)
    x, y = _batch(0)
    async with ActorSystem("refusals") as system:
        for name, config in [("sgd", sgd), ("window", windowed)]:
            saver = await Trainer.spawn(system, model(1), "cpu:0", config)
            await saver.ask(Step(x, y))
            await saver.ask(SaveCheckpoint(tmp_path / f"{name}.ckpt"))
            await saver.stop()
        trainer_class, options, n = STRATEGIES.get(loader, STRATEGIES["tensor-2"])
        ref = await trainer_class.spawn(system, model(5), cpu_devices(n), CONFIG, options)
        await ref.ask(Step(x, y))
        assert await _refused(ref, tmp_path / "sgd.ckpt") == (
            "checkpoint: optimizer state does not fit: state is for 'sgd', "
            "this optimizer is 'adamw'"
        )
        assert await _refused(ref, tmp_path / "window.ckpt") == (
            "checkpoint was saved 1 micro-step into a gradient accumulation window; "
            f"{trainer_name} with accumulation_steps=1 cannot resume it"
        )
