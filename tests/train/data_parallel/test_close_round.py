"""`CloseRound`: a trainer whose `Step`s answer before their batch is applied
(data parallel under CADENCE or ASYNC) says so in its `TrainingState`, and
closes its open round on request with the round's figures; `fit` closes it
at every epoch's end, so an epoch's record counts every batch it trained."""

from __future__ import annotations

import dataclasses
import logging
import math
from pathlib import Path

import numpy as np
import pytest

from atomr import ActorSystem, Props
from atomr.accel import cpu_devices
from atomr.testkit import Plan, inject_faults
from atomr.train import (
    Evaluate,
    GetWeights,
    LoadCheckpoint,
    LossKind,
    Mlp,
    OptimizerKind,
    SaveCheckpoint,
    Step,
    TrainerConfig,
    fit,
)
from atomr.train.core import CloseRound, GetTrainingState, StepStats, synthetic_classification
from atomr.train.data_parallel import (
    ApplyPolicy,
    DataParallelOptions,
    DataParallelTrainer,
    GetReplicaWeights,
    ReplicaActor,
    SetReplicas,
)
from atomr.train.data_parallel.messages import ComputeGradients
from atomr.train.fit import FitCallback, FitPosition, StopFlag

CONFIG = TrainerConfig(OptimizerKind.sgd(0.1), LossKind.CROSS_ENTROPY)
X, Y = synthetic_classification(96, 6, 3, seed=3)
LONG_ROUNDS = {
    "async": DataParallelOptions(policy=ApplyPolicy.ASYNC, average_every=100),
    "cadence": DataParallelOptions(
        policy=ApplyPolicy.CADENCE, cadence_anchor=50, cadence_auto_tune=False
    ),
}


@pytest.mark.parametrize(
    ("options", "rounds"),
    [(None, False), (LONG_ROUNDS["async"], True), (LONG_ROUNDS["cadence"], True)],
    ids=["sync", "async", "cadence"],
)
async def test_the_training_state_says_whether_steps_come_in_rounds(
    options: DataParallelOptions | None, rounds: bool
) -> None:
    async with ActorSystem("close-round") as system:
        dp = await DataParallelTrainer.spawn(
            system, Mlp([6, 8, 3]), cpu_devices(2), CONFIG, options
        )
        assert (await dp.ask(GetTrainingState())).rounds is rounds
        assert await dp.ask(CloseRound()) is None  # no round open


@pytest.mark.parametrize("policy", ["async", "cadence"])
async def test_close_round_answers_the_open_rounds_figures_once(policy: str) -> None:
    async with ActorSystem("close-round") as system:
        dp = await DataParallelTrainer.spawn(
            system, Mlp([6, 8, 3], seed=1), cpu_devices(2), CONFIG, LONG_ROUNDS[policy]
        )
        before = await dp.ask(Evaluate(X[:48], Y[:48]))
        for k in range(3):
            stats = await dp.ask(Step(X[16 * k : 16 * k + 16], Y[16 * k : 16 * k + 16]))
            assert (stats.applied, stats.samples) == (False, 0)
        closed = await dp.ask(CloseRound())
        assert closed.applied and closed.samples == 48
        if policy == "cadence":  # every gradient of the round is at the same weights
            assert closed.loss == pytest.approx(before.loss, rel=1e-5)
        else:
            assert math.isfinite(closed.loss) and closed.loss > 0
        a, b = await dp.ask(GetReplicaWeights())
        np.testing.assert_array_equal(a, b)
        assert not np.array_equal(a, await _initial_weights())
        assert await dp.ask(CloseRound()) is None  # closed once


async def _initial_weights() -> np.ndarray:
    return np.asarray(Mlp([6, 8, 3], seed=1).params)


@pytest.mark.parametrize("policy", ["async", "cadence"])
async def test_fit_counts_an_epochs_last_round_in_its_record(policy: str) -> None:
    """A round longer than an epoch: before, every record had no loss, no
    throughput and no step, and the batches' loss was never reported."""
    async with ActorSystem("close-round") as system:
        dp = await DataParallelTrainer.spawn(
            system, Mlp([6, 8, 3], seed=1), cpu_devices(2), CONFIG, LONG_ROUNDS[policy]
        )
        result = await fit(dp, (X, Y), epochs=2, batch_size=16)
        weights = await dp.ask(GetWeights())
        assert result.position.step == (await dp.ask(GetTrainingState())).step
    # one round per epoch: a cadence round is one update, a local-SGD round
    # one per batch (its replicas' local steps), as the trainer counts them
    assert [r.step for r in result.epochs] == ([6, 12] if policy == "async" else [1, 2])
    for record in result.epochs:
        assert math.isfinite(record.train_loss) and record.train_loss > 0
        assert record.samples_per_s > 0
    assert not np.array_equal(weights, await _initial_weights())


class _StopAt(FitCallback):
    """Requests a stop after the `batch`-th batch of the first epoch."""

    def __init__(self, stop: StopFlag, batch: int) -> None:
        self.stop, self.batch = stop, batch

    def on_step(self, position: FitPosition, stats: StepStats, mean_loss: float,
                rate: float) -> None:  # fmt: skip
        if position.batch == self.batch:
            self.stop.request()


@pytest.mark.parametrize(
    ("policy", "max_steps", "stop_at", "status", "steps"),
    [("async", 4, None, "reached max_steps", 4), ("cadence", None, 3, "interrupted", 1)],
)
async def test_fit_stopping_mid_round_closes_and_counts_the_round(
    policy: str, max_steps: int | None, stop_at: int | None, status: str, steps: int
) -> None:
    """`fit` stops part way through an epoch, a round open: at the trainer's
    step limit (ASYNC counts a batch when it hands it out, so the Step after
    the 4th is refused) or on a stop request. Before, it returned with the
    round open and uncounted: ASYNC's position said step 0 where the trainer
    said 4, and CADENCE's batches were not applied."""
    stop = StopFlag()
    config = dataclasses.replace(CONFIG, max_steps=max_steps)
    async with ActorSystem("close-round") as system:
        dp = await DataParallelTrainer.spawn(
            system, Mlp([6, 8, 3], seed=1), cpu_devices(2), config, LONG_ROUNDS[policy]
        )
        callbacks = [] if stop_at is None else [_StopAt(stop, stop_at)]
        result = await fit(dp, (X, Y), epochs=2, batch_size=16, stop=stop, callbacks=callbacks)
        state = await dp.ask(GetTrainingState())
        assert await dp.ask(CloseRound()) is None  # fit closed it
    assert result.status == status
    assert result.position.step == state.step == steps


@pytest.mark.parametrize("message", ["load", "set_replicas"])
@pytest.mark.parametrize("policy", ["async", "cadence"])
async def test_a_round_failing_before_a_load_or_new_replicas_is_logged_not_blocking(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, policy: str, message: str
) -> None:
    """`LoadCheckpoint` and `SetReplicas` replace what an open round would
    change: its failure does not stop them, and is logged. Under CADENCE a
    load dropped the failure silently, under ASYNC it was answered instead
    of loading; `SetReplicas` dropped it silently under both."""
    plan = Plan()
    faulty = inject_faults(ReplicaActor, plan, {"compute": ComputeGradients})
    model, path = Mlp([6, 8, 3], seed=0), tmp_path / "before.ckpt"
    async with ActorSystem("close-round") as system:
        replicas = [system.spawn(Props(faulty, model, d, CONFIG)) for d in cpu_devices(2)]
        dp = system.spawn(DataParallelTrainer.props(CONFIG, replicas, LONG_ROUNDS[policy]))
        await dp.ask(SaveCheckpoint(path))
        saved = await dp.ask(GetWeights())
        plan.arm("compute", ValueError)
        for x, y in ((X[:16], Y[:16]), (X[16:32], Y[16:32])):  # one fails; the round stays open
            assert not (await dp.ask(Step(x, y))).applied
        with caplog.at_level(logging.WARNING, logger="atomr.train.data_parallel.trainer"):
            if message == "load":
                assert await dp.ask(LoadCheckpoint(path)) is None
            else:
                assert await dp.ask(SetReplicas(replicas)) is None
        assert plan.fired == ["compute"]
        warned = [r.getMessage() for r in caplog.records if "round failed" in r.getMessage()]
        assert len(warned) == 1 and "injected failure" in warned[0], warned
        a, b = await dp.ask(GetReplicaWeights())
        np.testing.assert_array_equal(a, b)
        if message == "load":
            np.testing.assert_array_equal(a, saved)
        assert await dp.ask(CloseRound()) is None  # nothing left open


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("policy", ["async", "cadence"])
async def test_a_batch_refilled_after_its_step_answers_trains_as_it_was_sent(
    policy: str, dtype: type
) -> None:
    """A `Step` answered before its batch is applied must not read the
    sender's arrays later: a loader that refills one buffer for the next
    batch (as soon as the `Step` answers) trained on the later batches'
    data instead (the weights differed by up to 0.1). float64 features,
    which validation casts to the model's float32 (a new array, which the
    trainer keeps without copying it again), train as they were sent too."""

    async def trained(refill: bool) -> np.ndarray:
        buffer_x, buffer_y = np.empty((16, 6), dtype), np.empty(16, np.int64)
        async with ActorSystem("close-round") as system:
            dp = await DataParallelTrainer.spawn(
                system, Mlp([6, 8, 3], seed=1), cpu_devices(1), CONFIG, LONG_ROUNDS[policy]
            )  # one replica: which replica takes which batch is no matter of timing
            for k in range(6):
                x, y = X[16 * k : 16 * k + 16], Y[16 * k : 16 * k + 16]
                if refill:
                    buffer_x[:], buffer_y[:] = x, y
                    x, y = buffer_x, buffer_y
                await dp.ask(Step(x, y))
            if refill:
                buffer_x[:], buffer_y[:] = 0.0, 0
            await dp.ask(CloseRound())
            weights: np.ndarray = await dp.ask(GetWeights())
        return weights

    np.testing.assert_array_equal(await trained(refill=True), await trained(refill=False))
