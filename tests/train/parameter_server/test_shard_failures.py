"""A server shard's failure reaching a `ParameterServerWorker` is not the
worker's own: the worker answers its `TrainBatch` (or `Evaluate`) with it,
as a `Failure`, instead of raising it out of its `receive`, so that its
supervisor neither restarts it (a shard's `ContextPoisoned`: the worker's
device context is fine, and a restart would drop what it keeps between
batches) nor stops it (a shard's `Unrecoverable`). The trainer treats the
step as before: a shard that lost its state fails the `Step` at once with
`WorkerStateLost`, and a `LoadCheckpoint` brings the run back. A round
dropped under a worker's weight-0 push (its part of the batch empty) is
likewise answered, not raised."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atomr import ActorSystem, Props
from atomr.accel import ContextPoisoned, Unrecoverable, cpu_devices
from atomr.actor import actor_failed
from atomr.testkit import await_condition, inject_faults
from atomr.train import (
    Evaluate,
    LoadCheckpoint,
    LossKind,
    Mlp,
    NonFiniteError,
    OptimizerKind,
    SaveCheckpoint,
    Step,
    TrainerConfig,
    WorkerStateLost,
)
from atomr.train.parameter_server import (
    AsyncParameterServer,
    Consistency,
    ParameterServerOptions,
    ParameterServerWorker,
    RoundDroppedError,
    ServerShard,
)
from atomr.train.parameter_server.messages import (
    AbortPush,
    PullWeights,
    PushGradient,
    TrainBatch,
)
from tests.reliability.faults import Plan, T, batches
from tests.train.parameter_server.common import TWO_RANGE_SIZES, NumberedShard, config

PHASES = {"pull": PullWeights, "push": PushGradient, "abort": AbortPush}


class _Counting(ParameterServerWorker):
    """Counts the workers built (a restart builds a new one from the Props)."""

    built = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        type(self).built += 1


@pytest.mark.parametrize("phase", ["pull", "push"])
@pytest.mark.parametrize("error", [ContextPoisoned, Unrecoverable, RuntimeError])
async def test_a_shard_failure_is_the_workers_answer_not_its_own_failure(
    actor_system: ActorSystem, phase: str, error: type[Exception]
) -> None:
    """The shard fails on the worker's pull or push: the worker answers the
    `TrainBatch` with the shard's error and is neither restarted nor stopped
    (it used to raise it, and its supervisor restarted it); an `Evaluate`
    meeting a failing shard likewise; and it answers the next request."""
    _Counting.built = 0
    plan = Plan()
    model = Mlp(TWO_RANGE_SIZES, seed=4)
    shard = inject_faults(ServerShard, plan, PHASES)
    server = actor_system.spawn(Props(shard, model.get_params(), 0.1))
    worker = actor_system.spawn(
        _Counting.props(0, model, "cpu:0", config(), [server], [(0, model.n_params)])
    )
    (x, y), *_ = batches()
    plan.arm(phase, error)
    with pytest.raises(error, match="injected"):
        await worker.ask(TrainBatch(x, y), timeout=T)
    assert plan.fired == [phase]
    plan.arm("pull", error)
    with pytest.raises(error, match="injected"):
        await worker.ask(Evaluate(x, y), timeout=T)
    assert _Counting.built == 1  # never restarted
    # it still answers: the shard, restarted by its supervisor, refuses
    with pytest.raises(WorkerStateLost):
        await worker.ask(TrainBatch(x, y), timeout=T)
    assert _Counting.built == 1


@pytest.mark.parametrize("error", [ContextPoisoned, RuntimeError])
async def test_a_shard_failing_on_an_abort_leaves_the_worker_its_own_error(
    actor_system: ActorSystem, error: type[Exception]
) -> None:
    """A part whose gradient is not finite sends `AbortPush`; the shard fails
    on it: the worker answers its own `NonFiniteError` (the abort's answer
    is not needed) and is not restarted (it used to raise the shard's error)."""
    _Counting.built = 0
    plan = Plan()
    model = Mlp(TWO_RANGE_SIZES, seed=4)
    shard = inject_faults(ServerShard, plan, PHASES)
    server = actor_system.spawn(Props(shard, model.get_params(), 0.1))
    mse = TrainerConfig(OptimizerKind.sgd(0.1), LossKind.MSE)
    worker = actor_system.spawn(
        _Counting.props(0, model, "cpu:0", mse, [server], [(0, model.n_params)])
    )
    (x, _), *_ = batches()
    y = np.full((len(x), model.config()["sizes"][-1]), 3e38, dtype=np.float32)  # overflows
    plan.arm("abort", error)
    with pytest.raises(NonFiniteError):
        await worker.ask(TrainBatch(x, y), timeout=T)
    assert plan.fired == ["abort"]
    assert _Counting.built == 1


@pytest.mark.parametrize(
    ("workers", "consistency", "phase"),
    [(1, Consistency.asynchronous(), "pull"), (2, Consistency.synchronous(), "push")],
    ids=["async-pull", "sync-push"],
)
async def test_a_shard_losing_its_context_fails_the_step_without_restarting_a_worker(
    actor_system: ActorSystem, tmp_path: Path, workers: int, consistency: Consistency, phase: str
) -> None:
    """Shard 0's device context is poisoned by a worker's pull or push: the
    `Step` fails at once with `WorkerStateLost` naming the shard, as it did,
    but no worker is restarted (the one that met the shard used to be, as if
    its own device had failed); once a checkpoint is loaded, training goes on."""
    _Counting.built = 0
    plan = Plan()
    shard = inject_faults(NumberedShard, plan, {phase: PHASES[phase]}, worker=0)
    options = ParameterServerOptions(
        workers=workers,
        shards=2,
        consistency=consistency,
        server_class=shard,
        worker_class=_Counting,
    )
    model = Mlp(TWO_RANGE_SIZES, seed=4)
    ps = await AsyncParameterServer.spawn(
        actor_system, model, cpu_devices(workers), config(), options
    )
    await ps.ask(SaveCheckpoint(tmp_path / "start.ckpt"), timeout=T)
    (x, y), *_ = batches()
    plan.arm(phase, ContextPoisoned)
    with pytest.raises(WorkerStateLost, match="server shard 0 lost"):
        await ps.ask(Step(x, y), timeout=T)
    assert plan.fired == [phase]
    assert _Counting.built == workers  # no worker restarted
    await ps.ask(LoadCheckpoint(tmp_path / "start.ckpt"), timeout=T)
    assert (await ps.ask(Step(x, y), timeout=T)).applied
    assert _Counting.built == workers


class _NotingShard(ServerShard):
    """Notes every `PushGradient` it receives (`pushes`) before handling it."""

    pushes: list[PushGradient] = []

    async def receive(self, message: Any) -> Any:
        if isinstance(message, PushGradient):
            type(self).pushes.append(message)
        return await super().receive(message)


async def test_an_empty_part_whose_round_is_dropped_is_answered_not_raised(
    actor_system: ActorSystem,
) -> None:
    """A worker's empty part pushes a weight-0 gradient into a synchronous
    round that another worker then aborts: the worker answers its part with
    the `RoundDroppedError` its push met, as it answers a non-empty part's,
    instead of raising it out of its `receive` (a failure of its own, which
    its supervisor had to handle), and it answers its next part."""
    _Counting.built, _NotingShard.pushes = 0, []
    model = Mlp(TWO_RANGE_SIZES, seed=4)
    sync = Consistency.synchronous()
    server = actor_system.spawn(
        Props(_NotingShard, model.get_params(), 0.1, consistency=sync, workers=2)
    )
    worker = actor_system.spawn(
        _Counting.props(0, model, "cpu:0", config(), [server], [(0, model.n_params)], True)
    )
    (x, y), *_ = batches()
    part = asyncio.ensure_future(worker.ask(TrainBatch(x[:0], y[:0], round_id=0), timeout=T))
    await await_condition(lambda: bool(_NotingShard.pushes), timeout=T, message="the push came")
    with pytest.raises(RoundDroppedError):  # worker 1 aborts the round
        await server.ask(AbortPush(1, 0, "loss is not finite", 0), timeout=T)
    with pytest.raises(RoundDroppedError, match="worker 1") as info:
        await part
    assert not actor_failed(info.value)  # answered: the worker did not fail
    assert _Counting.built == 1
    both = asyncio.gather(
        worker.ask(TrainBatch(x[:0], y[:0], round_id=1), timeout=T),
        server.ask(AbortPush(1, 0, "a worker's own error", 1), timeout=T),
        return_exceptions=True,
    )
    assert all(isinstance(r, RoundDroppedError) for r in await both)  # it still answers
