"""`ShardedDataParallelTrainer` equals the single-device `Trainer`: ZeRO stages
1, 2 and 3, N = 1..4 replicas with uneven splits (neither the parameter
count nor the batch divides by N), SGD with momentum and AdamW, clipping on,
20 steps; and each stage holds the memory it promises."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from atomr import ActorRef, ActorSystem, Props
from atomr.accel import cpu_devices
from atomr.train import (
    DataParallelOptions,
    Evaluate,
    GetWeights,
    InvalidBatchError,
    LossKind,
    Mlp,
    OptimizerKind,
    SetLearningRate,
    ShardedDataParallelTrainer,
    ShardedOptions,
    Step,
    Trainer,
    TrainerConfig,
)
from atomr.train.comm import HostCollective
from atomr.train.core import GetTrainingState
from atomr.train.sharded import GetShardMemory, ShardedReplica, ShardLayout, ShardMemory

SIZES = [7, 9, 5, 3]  # 72 + 9 + 45 + 5 + 15 + 3 = 149 parameters (prime)
OPTIMIZERS = {
    "sgd-momentum": OptimizerKind.sgd(0.1, momentum=0.9),
    "adamw": OptimizerKind.adamw(0.01, weight_decay=0.05),
}


def _batches(n: int, rows: int = 13) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(4)
    return [
        (rng.standard_normal((rows, SIZES[0])).astype(np.float32), rng.integers(0, 3, rows))
        for _ in range(n)
    ]


async def _train(system: ActorSystem, cls: Any, n: int, config: TrainerConfig, options: Any) -> Any:
    model = Mlp(SIZES, "tanh", seed=3)
    devices = cpu_devices(n) if cls is not Trainer else ["cpu:0"]
    ref = await cls.spawn(system, model, devices, config, options)
    losses, norms = [], []
    for x, y in _batches(20):
        stats = await ref.ask(Step(x, y))
        losses.append(stats.loss)
        norms.append(stats.grad_norm)
    x, y = _batches(1, rows=31)[0]
    evaluation = await ref.ask(Evaluate(x, y))
    return losses, norms, await ref.ask(GetWeights()), evaluation


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
@pytest.mark.parametrize("stage", [1, 2, 3])
async def test_twenty_steps_equal_one_device(stage: int, optimizer: str) -> None:
    config = TrainerConfig(OPTIMIZERS[optimizer], LossKind.CROSS_ENTROPY, gradient_clip=0.3)
    async with ActorSystem("zero") as system:
        ref_losses, ref_norms, ref_weights, ref_eval = await _train(
            system, Trainer, 1, config, None
        )
        assert max(ref_norms) > 0.3  # clipping really happens
        for n in (1, 2, 3, 4):
            options = ShardedOptions(stage=stage)
            losses, norms, weights, evaluation = await _train(
                system, ShardedDataParallelTrainer, n, config, options
            )
            np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(norms, ref_norms, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(weights, ref_weights, rtol=1e-5, atol=1e-6)
            assert evaluation.loss == pytest.approx(ref_eval.loss, rel=1e-5)
            assert evaluation.accuracy == ref_eval.accuracy


async def _memory(stage: int, n: int) -> list[ShardMemory]:
    config = TrainerConfig(OptimizerKind.adamw(0.01), LossKind.CROSS_ENTROPY)
    async with ActorSystem("zero") as system:
        ref = await ShardedDataParallelTrainer.spawn(
            system, Mlp(SIZES, seed=1), cpu_devices(n), config, ShardedOptions(stage=stage)
        )
        x, y = _batches(1)[0]
        await ref.ask(Step(x, y))
        memory: list[ShardMemory] = await ref.ask(GetShardMemory())
        return memory


@pytest.mark.parametrize("stage", [1, 2, 3])
async def test_each_stage_keeps_the_memory_it_promises(stage: int) -> None:
    full = Mlp(SIZES).n_params * 4  # float32 bytes of one full vector
    n = 4
    memory = await _memory(stage, n)
    # the longest piece: 1/N rounded up, once per unit (stage 3 splits each layer)
    units = len(SIZES) - 1 if stage == 3 else 1
    piece = (-(-Mlp(SIZES).n_params // n) + units) * 4
    for m in memory:
        assert m.optimizer <= 2 * piece  # Adam's two moments over the piece only
        if stage == 1:
            assert m.gradients == full
        else:
            assert m.gradients <= piece
        if stage == 3:
            assert m.weights <= piece
            largest_layer = max(a * b + b for a, b in zip(SIZES[:-1], SIZES[1:], strict=False))
            assert m.gathered_peak == largest_layer * 4
        else:
            assert m.weights >= full  # the working copy
    total_state = sum(m.optimizer for m in memory)
    assert total_state == 2 * full  # the shards together hold one copy of the state


async def test_the_contract_messages_and_bad_input() -> None:
    config = TrainerConfig(
        OptimizerKind.sgd(0.1, momentum=0.9), LossKind.CROSS_ENTROPY, max_steps=3
    )
    async with ActorSystem("zero") as system:
        ref = await ShardedDataParallelTrainer.spawn(
            system, Mlp(SIZES, seed=1), cpu_devices(2), config, ShardedOptions(stage=3)
        )
        before = await ref.ask(GetWeights())
        x, y = _batches(1)[0]
        bad = x.copy()
        bad[2, 1] = np.nan
        with pytest.raises(InvalidBatchError):
            await ref.ask(Step(bad, y))
        with pytest.raises(ValueError):
            await ref.ask(SetLearningRate(float("nan")))
        np.testing.assert_array_equal(await ref.ask(GetWeights()), before)
        await ref.ask(SetLearningRate(0.05))
        for _ in range(3):
            await ref.ask(Step(x, y))
        state = await ref.ask(GetTrainingState())
        assert state.step == 3 and state.reached_max_steps and state.is_coordinator


def test_bad_options_are_refused() -> None:
    with pytest.raises(ValueError, match="stage"):
        ShardedOptions(stage=4)
    with pytest.raises(TypeError, match="stage"):
        ShardedOptions(stage=True)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="stage"):
        ShardedOptions(stage=2.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="collective must be 'host' or a Collective, got 'ring'"):
        ShardedOptions(collective="ring")  # a name it does not know: as DataParallelOptions
    with pytest.raises(TypeError, match="collective must be 'host' or a Collective, got int"):
        ShardedOptions(collective=5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="process_collective"):
        ShardedOptions(process_count=2, process_rank=1)
    with pytest.raises(TypeError, match="replica_class"):
        ShardedOptions(replica_class=int)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="process_rank"):
        ShardedOptions(process_rank=False)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="process_rank"):
        ShardedOptions(process_rank=1, process_count=1)


def test_numpy_integers_are_ints() -> None:
    # the rule of every count argument (`atomr._arguments`): np.int64(2) is an int
    options = ShardedOptions(stage=np.int64(2), process_rank=np.int32(0), process_count=np.int64(1))  # type: ignore[arg-type]
    assert (options.stage, options.process_rank, options.process_count) == (2, 0, 1)
    assert all(type(v) is int for v in (options.stage, options.process_rank, options.process_count))


async def test_accumulation_is_refused_before_anything_is_spawned() -> None:
    config = TrainerConfig(OptimizerKind.sgd(0.1), LossKind.CROSS_ENTROPY, accumulation_steps=2)
    async with ActorSystem("zero") as system:
        with pytest.raises(ValueError, match="accumulat"):
            await ShardedDataParallelTrainer.spawn(system, Mlp(SIZES), cpu_devices(2), config)
        assert list(system.actors) == []


class _CountsCloses(HostCollective):
    closes = 0

    def close(self) -> None:
        type(self).closes += 1
        super().close()


async def test_the_trainer_closes_only_a_collective_it_made() -> None:
    given = _CountsCloses()
    config = TrainerConfig(OptimizerKind.sgd(0.1), LossKind.CROSS_ENTROPY)
    x, y = _batches(1)[0]
    async with ActorSystem("zero") as system:
        ref = await ShardedDataParallelTrainer.spawn(
            system, Mlp(SIZES), cpu_devices(2), config, ShardedOptions(collective=given)
        )
        await ref.ask(Step(x, y), timeout=60)
        await ref.stop()
    assert _CountsCloses.closes == 0  # the caller's, still open
    summed = await given.all_reduce([np.ones(3, np.float32), np.ones(3, np.float32)])
    np.testing.assert_array_equal(summed, np.full(3, 2.0, np.float32))
    given.close()
    assert _CountsCloses.closes == 1


class _StaleMemoryReplica(ShardedReplica):
    """Its freshly allocated gradient buffer holds NaN, as reused memory may."""

    def compute_gradients(self, msg: Any) -> Any:
        model = self.model
        assert model is not None
        model.grads = self.backend.to_device(np.full(model.n_params, np.nan, model.dtype))
        return super().compute_gradients(msg)


async def test_a_replica_without_rows_hands_a_zero_gradient_whatever_its_memory_held() -> None:
    config = TrainerConfig(OptimizerKind.sgd(0.05), LossKind.CROSS_ENTROPY)
    options = ShardedOptions(stage=2, replica_class=_StaleMemoryReplica)
    async with ActorSystem("zero-empty-rows") as system:
        zero = await ShardedDataParallelTrainer.spawn(
            system, Mlp(SIZES, seed=2), cpu_devices(5), config, options
        )
        one = await Trainer.spawn(system, Mlp(SIZES, seed=2), ["cpu:0"], config)
        for x, y in _batches(3, rows=2):  # 3 of the 5 replicas get no row
            await zero.ask(Step(x, y))
            await one.ask(Step(x, y))
        weights = await zero.ask(GetWeights())
        np.testing.assert_allclose(weights, await one.ask(GetWeights()), rtol=1e-5, atol=1e-6)


def _own_replicas(
    model: Mlp, stage: int, n: int, config: TrainerConfig
) -> tuple[list[Props], ShardLayout]:
    """What a user building their own replicas writes (the docstring of `props`)."""
    layout = ShardLayout.for_model(model, stage, n)
    replicas = [
        Props(ShardedReplica, model, d, config, stage, layout, k)
        for k, d in enumerate(cpu_devices(n))
    ]
    return replicas, layout


@pytest.mark.parametrize("stage", [1, 2, 3])
async def test_a_trainer_from_props_trains_as_one_from_spawn(stage: int) -> None:
    config = TrainerConfig(OPTIMIZERS["adamw"], LossKind.CROSS_ENTROPY, gradient_clip=0.3)
    options = ShardedOptions(stage=stage)
    async with ActorSystem("zero") as system:
        model = Mlp(SIZES, "tanh", seed=3)
        spawned = await ShardedDataParallelTrainer.spawn(
            system, model, cpu_devices(3), config, options
        )
        replicas, layout = _own_replicas(model, stage, 3, config)
        built = system.spawn(
            ShardedDataParallelTrainer.props(model, replicas, config, layout, options)
        )
        runs = []
        for ref in (spawned, built):
            losses = [(await ref.ask(Step(x, y))).loss for x, y in _batches(5)]
            runs.append((losses, await ref.ask(GetWeights())))
    assert runs[1][0] == runs[0][0]
    np.testing.assert_array_equal(runs[1][1], runs[0][1])
    assert not np.array_equal(runs[0][1], model.get_params())


class _OwnReplica(ShardedReplica):
    pass


def _bad_props(case: str, model: Mlp, config: TrainerConfig, ref: ActorRef) -> dict[str, Any]:
    """`props`' arguments, one of them wrong."""
    replicas, layout = _own_replicas(model, 1, 2, config)
    accumulating = TrainerConfig(config.optimizer, config.loss, accumulation_steps=2)
    wrong: dict[str, dict[str, Any]] = {
        "model": {"model": "not a model"},
        "config": {"config": "not a config"},
        "replicas not a sequence": {"replicas": replicas[0]},
        "no replicas": {"replicas": []},
        "ActorRefs": {"replicas": [ref]},
        "layout": {"layout": "not a layout"},
        "another stage's layout": {"options": ShardedOptions(stage=3)},
        "more replicas than the layout": {"replicas": replicas * 2},
        "options": {"options": DataParallelOptions()},
        "accumulation": {"config": accumulating},
        "a job": {"options": ShardedOptions(process_collective=HostCollective())},
        "replica_class": {"options": ShardedOptions(replica_class=_OwnReplica)},
    }
    right = {"model": model, "replicas": replicas, "config": config, "layout": layout}
    return {**right, **wrong[case]}


BAD_PROPS = {
    "model": (TypeError, "^model must be a Sequential"),
    "config": (TypeError, "^config must be a TrainerConfig"),
    "replicas not a sequence": (TypeError, "^replicas must be a sequence"),
    "no replicas": (ValueError, "^replicas is empty"),
    "ActorRefs": (TypeError, "^replicas must be Props, got ActorRef: the sharded trainer spawns"),
    "layout": (TypeError, "^layout must be a ShardLayout, got str"),
    "another stage's layout": (ValueError, r"ShardLayout.for_model\(model, 3, 2, 1, 0\)"),
    "more replicas than the layout": (ValueError, r"ShardLayout.for_model\(model, 1, 4, 1, 0\)"),
    "options": (TypeError, "options must be a ShardedOptions or None, got DataParallelOptions"),
    "accumulation": (ValueError, "does not accumulate gradients"),
    "a job": (ValueError, "in a multi-process job .* use spawn"),
    "replica_class": (ValueError, "leave it ShardedReplica"),
}


@pytest.mark.parametrize("case", list(BAD_PROPS))
async def test_props_refuses_bad_arguments_before_anything_is_spawned(case: str) -> None:
    config = TrainerConfig(OPTIMIZERS["sgd-momentum"], LossKind.CROSS_ENTROPY)
    model = Mlp(SIZES, "tanh", seed=3)
    error, match = BAD_PROPS[case]
    async with ActorSystem("zero") as system:
        other = system.spawn(
            Props(ShardedReplica, model, "cpu:0", config, 1, ShardLayout.for_model(model, 1, 1), 0)
        )
        before = list(system.actors)
        with pytest.raises(error, match=match):
            ShardedDataParallelTrainer.props(**_bad_props(case, model, config, other))
        assert list(system.actors) == before
