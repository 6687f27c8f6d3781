"""The verbs of a hand-written loop on `DataParallelTrainer` (flodl's manual
`Ddp`): compute per replica, all-reduce (plain or weighted by batch counts),
apply; sync the parameters; world size and devices. One hand-written step
equals the single-device Trainer's step on the union of the batches."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from atomr import ActorSystem
from atomr.accel import Device, cpu_devices
from atomr.train import (
    GetWeights,
    LossKind,
    Mlp,
    OptimizerKind,
    SetLearningRate,
    Step,
    Trainer,
    TrainerConfig,
)
from atomr.train.comm import HostCollective
from atomr.train.core import GetTrainingState, synthetic_classification
from atomr.train.core.errors import StepLimitError
from atomr.train.data_parallel import (
    AllReduceGradients,
    ApplyGradients,
    ComputeReplicaGradients,
    DataParallelOptions,
    DataParallelTrainer,
    GetDevices,
    GetReplicaWeights,
    GetWorldSize,
    SyncParams,
    WeightedAllReduceGradients,
)

CONFIG = TrainerConfig(OptimizerKind.adamw(0.01), LossKind.CROSS_ENTROPY, gradient_clip=0.5)
X, Y = synthetic_classification(64, 6, 3, seed=3)


async def _pair(system: ActorSystem) -> tuple[Any, Any]:
    dp = await DataParallelTrainer.spawn(system, Mlp([6, 8, 3], seed=0), cpu_devices(2), CONFIG)
    one = await Trainer.spawn(system, Mlp([6, 8, 3], seed=0), "cpu:0", CONFIG)
    return dp, one


async def test_a_weighted_step_by_hand_equals_one_device_on_the_union() -> None:
    async with ActorSystem("manual") as system:
        dp, one = await _pair(system)
        for lo, cut, hi in ((0, 5, 24), (24, 40, 44)):  # uneven: 5 + 19, then 16 + 4 rows
            batches = [(X[lo:cut], Y[lo:cut]), (X[cut:hi], Y[cut:hi])]
            losses = await dp.ask(ComputeReplicaGradients(batches))
            assert len(losses) == 2
            await dp.ask(WeightedAllReduceGradients([cut - lo, hi - cut]))
            await dp.ask(ApplyGradients())
            await one.ask(Step(X[lo:hi], Y[lo:hi]))
        replicas = await dp.ask(GetReplicaWeights())
        np.testing.assert_array_equal(replicas[0], replicas[1])
        np.testing.assert_allclose(replicas[0], await one.ask(GetWeights()), rtol=1e-5, atol=1e-6)


async def test_a_plain_all_reduce_averages_equal_batches() -> None:
    async with ActorSystem("manual") as system:
        dp, one = await _pair(system)
        await dp.ask(ComputeReplicaGradients([(X[:16], Y[:16]), (X[16:32], Y[16:32])]))
        norm = await dp.ask(AllReduceGradients())
        stats = await one.ask(Step(X[:32], Y[:32]))
        assert norm == pytest.approx(stats.grad_norm, rel=1e-5)
        assert await dp.ask(ApplyGradients()) == pytest.approx(stats.grad_norm, rel=1e-5)
        np.testing.assert_allclose(
            await dp.ask(GetWeights()), await one.ask(GetWeights()), rtol=1e-5, atol=1e-6
        )


async def test_sync_params_makes_diverged_replicas_identical_again() -> None:
    async with ActorSystem("manual") as system:
        dp, _ = await _pair(system)
        await dp.ask(ComputeReplicaGradients([(X[:8], Y[:8]), (X[8:40], Y[8:40])]))
        await dp.ask(ApplyGradients())  # each its own gradient: they diverge
        a, b = await dp.ask(GetReplicaWeights())
        assert not np.array_equal(a, b)
        await dp.ask(SyncParams())
        a2, b2 = await dp.ask(GetReplicaWeights())
        np.testing.assert_array_equal(a2, a)
        np.testing.assert_array_equal(b2, a)


async def test_sync_params_in_a_job_keeps_the_learning_rate_and_the_optimizer_state() -> None:
    # a job of one process (a host collective joins it): SyncParams broadcasts
    # process 0's weights; the replicas keep the rate set and their optimizer state
    options = DataParallelOptions(process_collective=HostCollective())
    async with ActorSystem("manual") as system:
        dp = await DataParallelTrainer.spawn(
            system, Mlp([6, 8, 3], seed=0), cpu_devices(2), CONFIG, options
        )
        one = await Trainer.spawn(system, Mlp([6, 8, 3], seed=0), "cpu:0", CONFIG)
        for trainer in (dp, one):
            await trainer.ask(Step(X[:32], Y[:32]))
            await trainer.ask(SetLearningRate(0.001))
        await dp.ask(SyncParams())
        for trainer in (dp, one):
            await trainer.ask(Step(X[32:], Y[32:]))
        np.testing.assert_allclose(
            await dp.ask(GetWeights()), await one.ask(GetWeights()), rtol=1e-5, atol=1e-6
        )


@pytest.mark.parametrize(
    "counts, error, match",
    [
        ([], ValueError, "one count per replica"),
        ([3], ValueError, "one count per replica"),
        ([3, -1], ValueError, ">= 0"),
        ([3, float("nan")], ValueError, "finite"),
        ([0, 0], ValueError, "not all 0"),
        ("12", TypeError, "sequence of numbers"),
    ],
)
async def test_bad_batch_counts_change_nothing(counts: Any, error: type, match: str) -> None:
    async with ActorSystem("manual") as system:
        dp, one = await _pair(system)
        batches = [(X[:16], Y[:16]), (X[16:32], Y[16:32])]
        await dp.ask(ComputeReplicaGradients(batches))
        with pytest.raises(error, match=match):
            await dp.ask(WeightedAllReduceGradients(counts))
        # the buffers are as they were: a good reduction still gives the union's step
        await dp.ask(WeightedAllReduceGradients([16, 16]))
        await dp.ask(ApplyGradients())
        await one.ask(Step(X[:32], Y[:32]))
        np.testing.assert_allclose(
            await dp.ask(GetWeights()), await one.ask(GetWeights()), rtol=1e-5, atol=1e-6
        )


async def test_world_size_and_devices() -> None:
    async with ActorSystem("manual") as system:
        dp, _ = await _pair(system)
        assert await dp.ask(GetWorldSize()) == 2
        assert await dp.ask(GetDevices()) == (Device.parse("cpu:0"), Device.parse("cpu:1"))
        with pytest.raises(ValueError, match="one batch per replica"):
            await dp.ask(ComputeReplicaGradients([(X[:4], Y[:4])]))


async def test_apply_gradients_stops_at_max_steps() -> None:
    """`ApplyGradients` is an optimizer step: at `max_steps` it is refused
    with StepLimitError and nothing changes, as a `Step` is."""
    config = TrainerConfig(
        OptimizerKind.sgd(0.1, momentum=0.9), LossKind.CROSS_ENTROPY, max_steps=1
    )
    async with ActorSystem("manual") as system:
        dp = await DataParallelTrainer.spawn(system, Mlp([6, 8, 3], seed=0), cpu_devices(2), config)
        batches = [(X[:8], Y[:8]), (X[8:16], Y[8:16])]
        await dp.ask(ComputeReplicaGradients(batches))
        await dp.ask(AllReduceGradients())
        await dp.ask(ApplyGradients())
        before = await dp.ask(GetWeights())
        await dp.ask(ComputeReplicaGradients(batches))
        await dp.ask(AllReduceGradients())
        with pytest.raises(StepLimitError, match="max_steps"):
            await dp.ask(ApplyGradients())
        np.testing.assert_array_equal(await dp.ask(GetWeights()), before)
        assert (await dp.ask(GetTrainingState())).step == 1


async def test_gradients_are_applied_at_most_once() -> None:
    """The replicas' buffers are applied once per `ComputeReplicaGradients`:
    `ApplyGradients` (or an all-reduce) before any, a second one, or one after
    a `Step` (whose gradient is in the buffers and already applied) is refused
    with nothing changed, instead of applying a gradient again."""
    async with ActorSystem("manual") as system:
        dp, one = await _pair(system)
        batches = [(X[:16], Y[:16]), (X[16:32], Y[16:32])]
        with pytest.raises(RuntimeError, match="ComputeReplicaGradients first"):
            await dp.ask(ApplyGradients())
        await dp.ask(ComputeReplicaGradients(batches))
        await dp.ask(AllReduceGradients())
        await dp.ask(ApplyGradients())
        await one.ask(Step(X[:32], Y[:32]))
        with pytest.raises(RuntimeError, match="ComputeReplicaGradients first"):
            await dp.ask(ApplyGradients())
        await dp.ask(Step(X[32:48], Y[32:48]))
        await one.ask(Step(X[32:48], Y[32:48]))
        for verb in (AllReduceGradients(), ApplyGradients()):
            with pytest.raises(RuntimeError, match="ComputeReplicaGradients first"):
                await dp.ask(verb)
        np.testing.assert_allclose(
            await dp.ask(GetWeights()), await one.ask(GetWeights()), rtol=1e-5, atol=1e-6
        )


@pytest.mark.parametrize("weighted", [False, True])
async def test_a_float64_model_keeps_float64_precision_by_hand(weighted: bool) -> None:
    """A float64 model's hand-written step equals the single-device Trainer's
    to float64 precision: the all-reduced mean keeps the model's dtype."""
    config = TrainerConfig(OptimizerKind.sgd(0.1), LossKind.CROSS_ENTROPY)
    x, y = X.astype(np.float64), Y
    async with ActorSystem("manual") as system:
        model = Mlp([6, 8, 3], seed=0, dtype=np.float64)
        dp = await DataParallelTrainer.spawn(system, model, cpu_devices(2), config)
        one = await Trainer.spawn(system, Mlp([6, 8, 3], seed=0, dtype=np.float64), "cpu:0", config)
        await dp.ask(ComputeReplicaGradients([(x[:16], y[:16]), (x[16:32], y[16:32])]))
        reduce = WeightedAllReduceGradients([16, 16]) if weighted else AllReduceGradients()
        await dp.ask(reduce)
        await dp.ask(ApplyGradients())
        await one.ask(Step(x[:32], y[:32]))
        weights = await dp.ask(GetWeights())
        assert weights.dtype == np.float64
        np.testing.assert_allclose(weights, await one.ask(GetWeights()), rtol=0, atol=1e-13)


async def test_manual_verbs_are_refused_inside_an_accumulation_window() -> None:
    """With `accumulation_steps` > 1 the replicas' buffers hold the open
    window's partial sums: a manual verb then is refused with RuntimeError,
    nothing changed, and the window's last `Step` equals the Trainer's."""
    config = TrainerConfig(OptimizerKind.sgd(0.1), LossKind.CROSS_ENTROPY, accumulation_steps=2)
    async with ActorSystem("manual") as system:
        dp = await DataParallelTrainer.spawn(system, Mlp([6, 8, 3], seed=0), cpu_devices(2), config)
        one = await Trainer.spawn(system, Mlp([6, 8, 3], seed=0), "cpu:0", config)
        for trainer in (dp, one):
            assert not (await trainer.ask(Step(X[:16], Y[:16]))).applied
        batches = [(X[32:40], Y[32:40]), (X[40:48], Y[40:48])]
        verbs = (ComputeReplicaGradients(batches), AllReduceGradients(), ApplyGradients())
        for verb in (*verbs, WeightedAllReduceGradients([8, 8])):
            with pytest.raises(RuntimeError, match="accumulation window is open"):
                await dp.ask(verb)
        for trainer in (dp, one):
            assert (await trainer.ask(Step(X[16:32], Y[16:32]))).applied
        np.testing.assert_allclose(
            await dp.ask(GetWeights()), await one.ask(GetWeights()), rtol=1e-5, atol=1e-6
        )
        for verb in verbs:  # the window is closed: a hand-written step is taken again
            await dp.ask(verb)
        assert (await dp.ask(GetTrainingState())).step == 2


async def test_manual_verbs_under_cadence_close_the_open_round_first() -> None:
    """A CADENCE round spans several `Step`s in the replicas' gradient
    buffers: a manual compute used to overwrite it mid-round. The verbs now
    see the round closed, as `SaveCheckpoint` does."""
    from atomr.train.core import CloseRound
    from atomr.train.data_parallel import ApplyPolicy, DataParallelOptions

    options = DataParallelOptions(
        policy=ApplyPolicy.CADENCE, cadence_anchor=50, cadence_auto_tune=False
    )
    batches = [(X[:16], Y[:16]), (X[16:32], Y[16:32])]
    weights = []
    async with ActorSystem("manual") as system:
        for close_first in (True, False):
            dp = await DataParallelTrainer.spawn(
                system, Mlp([6, 8, 3], seed=0), cpu_devices(2), CONFIG, options
            )
            for k in range(3):
                await dp.ask(Step(X[32 + 8 * k : 40 + 8 * k], Y[32 + 8 * k : 40 + 8 * k]))
            if close_first:
                assert (await dp.ask(CloseRound())).samples == 24
            await dp.ask(ComputeReplicaGradients(batches))
            await dp.ask(AllReduceGradients())
            await dp.ask(ApplyGradients())
            assert await dp.ask(CloseRound()) is None  # nothing left open
            a, b = await dp.ask(GetReplicaWeights())
            np.testing.assert_array_equal(a, b)
            weights.append(a)
    np.testing.assert_array_equal(weights[0], weights[1])
