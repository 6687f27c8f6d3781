"""The one trainer contract: the same program trains with each of the five
strategies, and swapping strategies changes one line (the `STRATEGY = ...`
pair below). Each run equals the single-device `Trainer` step for step."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atomr import Actor, ActorRef, ActorSystem, Failure, Props
from atomr.accel import cpu_devices
from atomr.train import (
    AsyncParameterServer,
    DataParallelOptions,
    DataParallelTrainer,
    EvalResult,
    Evaluate,
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
    StepStats,
    TensorParallelOptions,
    TensorParallelTrainer,
    Trainer,
    TrainerConfig,
    fit,
)
from atomr.train._contract import spawn_ready
from atomr.train.core import synthetic_classification
from atomr.train.parameter_server import Consistency

CONFIG = TrainerConfig(OptimizerKind.adamw(0.01), LossKind.CROSS_ENTROPY, gradient_clip=1.0)

STRATEGIES: dict[str, tuple[Any, Any, int]] = {
    "single": (Trainer, None, 1),
    "data": (DataParallelTrainer, DataParallelOptions(collective="ring"), 2),
    "tensor": (TensorParallelTrainer, TensorParallelOptions(), 2),
    "pipeline": (PipelineParallelTrainer, PipelineOptions(micro_batch_size=8), 2),
    "zero-1": (ShardedDataParallelTrainer, ShardedOptions(stage=1), 2),
    "zero-3": (ShardedDataParallelTrainer, ShardedOptions(stage=3), 3),
    "ps": (
        AsyncParameterServer,
        ParameterServerOptions(workers=1, consistency=Consistency.synchronous()),
        1,
    ),
}


async def _program(system: ActorSystem, trainer_class: Any, options: Any, n: int, tmp: Path) -> Any:
    """A user's program: nothing in it depends on the strategy but one line."""
    tmp.mkdir()
    model = Mlp([6, 16, 16, 3], seed=0)
    ref: ActorRef = await trainer_class.spawn(system, model, cpu_devices(n), CONFIG, options)
    x, y = synthetic_classification(96, 6, 3, seed=2)
    stats = [await ref.ask(Step(x[i : i + 32], y[i : i + 32])) for i in range(0, 96, 32)]
    assert all(isinstance(s, StepStats) for s in stats)
    await ref.ask(SaveCheckpoint(tmp / "c.ckpt"))
    result = await fit(ref, (x, y), epochs=2, batch_size=24, seed=1)
    evaluation = await ref.ask(Evaluate(x, y))
    assert isinstance(evaluation, EvalResult)
    weights = await ref.ask(GetWeights())
    assert isinstance(weights, np.ndarray) and weights.shape == (model.n_params,)
    await ref.ask(LoadCheckpoint(tmp / "c.ckpt"))
    reloaded = await ref.ask(GetWeights())
    await ref.stop()
    return [s.loss for s in stats], [r.train_loss for r in result.epochs], weights, reloaded


@pytest.mark.parametrize("strategy", list(STRATEGIES))
async def test_the_same_program_trains_with_every_strategy(strategy: str, tmp_path: Path) -> None:
    trainer_class, options, n = STRATEGIES[strategy]
    async with ActorSystem("contract") as system:
        ref_run = await _program(system, Trainer, None, 1, tmp_path / "ref")
        run = await _program(system, trainer_class, options, n, tmp_path / strategy)
    (ref_losses, ref_epochs, ref_weights, ref_reloaded), (losses, epochs, weights, reloaded) = (
        ref_run,
        run,
    )
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(epochs, ref_epochs, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(weights, ref_weights, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(reloaded, ref_reloaded, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("strategy", list(STRATEGIES))
async def test_options_of_another_strategy_are_refused(strategy: str) -> None:
    trainer_class, _, n = STRATEGIES[strategy]
    async with ActorSystem("contract") as system:
        before = list(system.actors)
        with pytest.raises(TypeError, match="options"):
            await trainer_class.spawn(
                system, Mlp([6, 8, 3]), cpu_devices(n), CONFIG, PipelineOptions()
                if strategy != "pipeline" else DataParallelOptions()
            )  # fmt: skip
        assert list(system.actors) == before


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("wrong", ["system", "name"])
async def test_a_wrong_system_or_name_is_a_type_error_naming_it(strategy: str, wrong: str) -> None:
    """The contract's `TypeError` naming the argument, before anything is spawned."""
    trainer_class, options, n = STRATEGIES[strategy]
    async with ActorSystem("contract") as system:
        before = list(system.actors)
        target: Any = "not a system" if wrong == "system" else system
        name: Any = 3 if wrong == "name" else None
        with pytest.raises(TypeError, match=f"^{wrong} must be"):
            await trainer_class.spawn(target, Mlp([6, 8, 3]), cpu_devices(n), CONFIG, options, name)
        assert list(system.actors) == before


BEFORE = Path(__file__).parent / "fixtures" / "before_reorganisation.ckpt"
"""A checkpoint the single-device Trainer wrote before `atomr/train` was
reorganised into packages (commit ec447be): a 6-8-3 Mlp after two AdamW steps."""


@pytest.mark.parametrize("strategy", list(STRATEGIES))
async def test_a_checkpoint_from_before_the_reorganisation_loads(strategy: str) -> None:
    trainer_class, options, n = STRATEGIES[strategy]
    config = TrainerConfig(OptimizerKind.adamw(0.01), LossKind.CROSS_ENTROPY)
    x, y = synthetic_classification(32, 6, 3, seed=5)
    async with ActorSystem("contract") as system:
        refs = [
            await Trainer.spawn(system, Mlp([6, 8, 3], seed=9), ["cpu:0"], config),
            await trainer_class.spawn(system, Mlp([6, 8, 3], seed=9), cpu_devices(n), config, options),
        ]  # fmt: skip
        for ref in refs:
            await ref.ask(LoadCheckpoint(BEFORE))
        loaded = [await ref.ask(GetWeights()) for ref in refs]
        np.testing.assert_array_equal(loaded[1], loaded[0])
        assert not np.array_equal(loaded[0], Mlp([6, 8, 3], seed=9).params)
        stats = [await ref.ask(Step(x, y)) for ref in refs]
        after = [await ref.ask(GetWeights()) for ref in refs]
    assert stats[1].loss == pytest.approx(stats[0].loss, rel=1e-5)
    np.testing.assert_allclose(after[1], after[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("strategy", list(STRATEGIES))
async def test_every_trainer_refuses_what_it_does_not_handle_alike(strategy: str) -> None:
    """An unknown message, and a message class sent without its `()`, are
    refused with a `TypeError` that says which; an unknown one (a plain
    `(features, labels)` tuple) is told what to send instead. The trainer
    goes on."""
    trainer_class, options, n = STRATEGIES[strategy]
    hint = re.escape(": send Step(features, labels) to train on a batch; a trainer also takes ")
    async with ActorSystem("contract") as system:
        ref = await trainer_class.spawn(system, Mlp([6, 8, 3]), cpu_devices(n), CONFIG, options)
        with pytest.raises(
            TypeError, match=rf"^{trainer_class.__name__} does not handle str{hint}"
        ):
            await ref.ask("hello")
        x, y = synthetic_classification(8, 6, 3, seed=0)
        with pytest.raises(TypeError, match=rf"does not handle tuple{hint}"):
            await ref.ask((x, y))
        with pytest.raises(TypeError, match=r"the class GetWeights: send an instance"):
            await ref.ask(GetWeights)
        assert (await ref.ask(GetWeights())).shape == (Mlp([6, 8, 3]).n_params,)


class _FailsToStart(Actor):
    """A trainer whose workers cannot start: it answers the readiness ask with
    their error, and has a child (a worker) that must go with it."""

    def pre_start(self) -> None:
        self.context.spawn(Props(_Idle), name="worker-0")

    def receive(self, message: Any) -> Any:
        return Failure(ValueError("worker 0 could not start"))


class _Idle(Actor):
    def receive(self, message: Any) -> Any:
        return None


async def test_a_failed_spawn_leaves_no_trainer_or_worker_running() -> None:
    async with ActorSystem("spawn") as system:
        with pytest.raises(ValueError, match="could not start"):
            await spawn_ready(system, Props(_FailsToStart), "t", "ready?", 5.0)
        assert system.actors == []  # stopped and gone when spawn raised, children first
        ref = await spawn_ready(system, Props(_Idle), "t", "ready?", 5.0)  # the name is free
        assert ref.is_alive


@pytest.mark.parametrize("stage", [1, 3])
async def test_zero_with_a_replica_that_would_own_nothing_is_refused_before_spawning(
    stage: int,
) -> None:
    async with ActorSystem("zero") as system:
        model = Mlp([2, 1, 2], seed=0)  # 7 parameters; stage 3 splits its layers of 3 and 4
        with pytest.raises(ValueError, match="would own none of the model's 7 parameters"):
            await ShardedDataParallelTrainer.spawn(
                system,
                model,
                cpu_devices(8 if stage == 1 else 5),
                CONFIG,
                ShardedOptions(stage=stage),
            )
        assert system.actors == []
        fits = await ShardedDataParallelTrainer.spawn(
            system, model, cpu_devices(7 if stage == 1 else 3), CONFIG, ShardedOptions(stage=stage)
        )
        assert isinstance(
            await fits.ask(Step(*synthetic_classification(8, 2, 2, seed=0))), StepStats
        )


TINY_EPS = TrainerConfig(OptimizerKind.adam(0.01, eps=1e-50), LossKind.CROSS_ENTROPY)
"""eps=1e-50 is 0 in float32, a valid eps in float64."""


@pytest.mark.parametrize("strategy", list(STRATEGIES))
async def test_a_hyperparameter_float32_cannot_hold_is_refused_for_a_float32_model_at_spawn(
    strategy: str,
) -> None:
    """Checked in the model's dtype before anything is spawned, naming the
    hyperparameter, its value and the dtype."""
    trainer_class, options, n = STRATEGIES[strategy]
    async with ActorSystem("contract") as system:
        with pytest.raises(ValueError, match="adam cannot compute in float32: eps=1e-50 rounds"):
            await trainer_class.spawn(system, Mlp([6, 8, 3]), cpu_devices(n), TINY_EPS, options)
        assert system.actors == []


@pytest.mark.parametrize("strategy", list(STRATEGIES))
async def test_a_float64_model_trains_with_an_eps_float32_cannot_hold(
    strategy: str, tmp_path: Path
) -> None:
    """One Adam step from zero moments moves each weight by
    `lr * g / (|g| + eps)` (torch's formula, bias corrections cancelling):
    with eps=1e-50 in float64 that is exactly lr (or 0 where g is 0), which
    eps=1e-8 would miss by lr * 1e-8 / |g|. A rate float32 cannot hold is
    taken too (`SetLearningRate`, checked in the model's dtype), and the
    checkpoint holding both loads (checked in float64)."""
    trainer_class, options, n = STRATEGIES[strategy]
    model = Mlp([6, 8, 3], seed=4, dtype=np.float64)
    x, y = synthetic_classification(32, 6, 3, seed=6)
    async with ActorSystem("contract") as system:
        ref = await trainer_class.spawn(system, model, cpu_devices(n), TINY_EPS, options)
        await ref.ask(Step(x.astype(np.float64), y))
        moved = np.abs(await ref.ask(GetWeights()) - model.get_params())
        await ref.ask(SetLearningRate(1e39))
        await ref.ask(SaveCheckpoint(tmp_path / "c.ckpt"))
        await ref.ask(LoadCheckpoint(tmp_path / "c.ckpt"))
    assert moved.dtype == np.float64
    np.testing.assert_allclose(moved[moved > 0], 0.01, rtol=1e-12)
    assert (moved > 0).mean() > 0.5


@pytest.mark.parametrize("strategy", list(STRATEGIES))
async def test_a_rate_float32_cannot_hold_is_refused_for_a_float32_model(strategy: str) -> None:
    """`SetLearningRate(1e39)` (finite in float64) is refused by the trainer,
    in the model's dtype, before any worker is asked (a worker's refusal
    would come with a note that the workers' rates may now differ): the
    next step is the old rate's."""
    trainer_class, options, n = STRATEGIES[strategy]
    config = TrainerConfig(OptimizerKind.sgd(0.1), LossKind.CROSS_ENTROPY)
    x, y = synthetic_classification(32, 6, 3, seed=6)
    async with ActorSystem("contract") as system:
        refs = [
            await trainer_class.spawn(system, Mlp([6, 8, 3], seed=4), cpu_devices(n), config, options),
            await Trainer.spawn(system, Mlp([6, 8, 3], seed=4), ["cpu:0"], config),
        ]  # fmt: skip
        with pytest.raises(
            ValueError, match="sgd cannot compute in float32: lr must be finite"
        ) as e:
            await refs[0].ask(SetLearningRate(1e39))
        assert getattr(e.value, "__notes__", None) is None
        for ref in refs:
            await ref.ask(Step(x, y))
        after = [await ref.ask(GetWeights()) for ref in refs]
    np.testing.assert_allclose(after[0], after[1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("trainer_class", [Trainer, AsyncParameterServer])
def test_props_taking_the_model_check_the_optimizer_in_its_dtype(trainer_class: Any) -> None:
    """No actor is needed to refuse it: the `Props` are never made."""
    with pytest.raises(ValueError, match="adam cannot compute in float32: eps=1e-50"):
        trainer_class.props(Mlp([6, 8, 3]), ["cpu:0"], TINY_EPS)
    assert isinstance(
        trainer_class.props(Mlp([6, 8, 3], dtype=np.float64), ["cpu:0"], TINY_EPS), Props
    )


@pytest.mark.parametrize(
    ("weight", "refusal"),
    [
        (1e39, "weight 1e[+]39 of class 0 .* finite in float32"),  # infinite in float32
        (1e-50, r"class_weights\[0\]=1e-50 rounds to 0 in float32"),  # 0 in float32
    ],
)
@pytest.mark.parametrize("strategy", list(STRATEGIES))
async def test_class_weights_are_checked_in_the_models_dtype_at_spawn(
    strategy: str, weight: float, refusal: str
) -> None:
    """A float32 model refuses the weight before anything is spawned (its
    kernel would compute with inf, or with 0: its class silently dropped); a
    float64 one trains with it, to a finite loss (the weighted mean is taken
    in float64)."""
    trainer_class, options, n = STRATEGIES[strategy]
    config = TrainerConfig(OptimizerKind.sgd(0.01), LossKind.weighted_cross_entropy([weight, 1, 1]))
    x, y = synthetic_classification(32, 6, 3, seed=6)
    async with ActorSystem("contract") as system:
        with pytest.raises(ValueError, match=refusal):
            await trainer_class.spawn(system, Mlp([6, 8, 3]), cpu_devices(n), config, options)
        assert system.actors == []
        model = Mlp([6, 8, 3], seed=4, dtype=np.float64)
        ref = await trainer_class.spawn(system, model, cpu_devices(n), config, options)
        stats = await ref.ask(Step(x.astype(np.float64), y))
    assert np.isfinite(stats.loss) and stats.applied
