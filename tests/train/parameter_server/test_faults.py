"""Fault injection for `ServerShard`: the server side, which test_server.py
and test_training.py do not cover (they cover bad pushes and a worker
crashing in its gradient computation).

Here: the server's device failing in the gradient aggregation (before the
update) and its optimizer dying with half the weight vector written, in the
asynchronous and synchronous models. The pusher must get the typed error
(in the synchronous model, `RoundFailedError` caused by it);
the server's weights and version must be unchanged; the server must keep
serving; and the pushes after the fault must end exactly where a server
that never saw the failed push ends. Last, a server shard of the trainer
restarted after `ContextPoisoned` outside its update (on a pull) has lost its
range: the trainer refuses with `WorkerStateLost` until a checkpoint is
loaded, instead of training on from the shard's initial weights.

The faults go in through the server's public hook `apply_gradients` and its
messages (`atomr.testkit.inject_faults`, `tests.reliability.faults.dying_optimizer`),
given to the trainer as `ParameterServerOptions.server_class`.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atomr import ActorSystem, Props
from atomr.accel import ContextPoisoned, cpu_devices
from atomr.actor import AskTimeoutError
from atomr.testkit import await_condition, inject_faults
from atomr.train import (
    AsyncParameterServer,
    Evaluate,
    GetWeights,
    LoadCheckpoint,
    LossKind,
    Mlp,
    OptimizerKind,
    ParameterServerOptions,
    SaveCheckpoint,
    Step,
    Trainer,
    TrainerConfig,
    WorkerStateLost,
)
from atomr.train.core.model import Activation, Layer, Linear, Sequential, register_layer
from atomr.train.parameter_server import (
    Consistency,
    GetServerStats,
    ParameterServerWorker,
    RoundFailedError,
    ServerShard,
)
from atomr.train.parameter_server.messages import PullWeights, PushGradient, TrainBatch
from tests.reliability.faults import (
    FAULT_AT,
    Plan,
    T,
    batches,
    dying_optimizer,
    held_out,
    lost_until_reloaded,
)
from tests.train.parameter_server.common import FIRST_RANGE, TWO_RANGE_SIZES, NumberedShard

N = 64
PUSHES = 8


def faulty_server(plan: Plan) -> type[ServerShard]:
    """A server whose update fails when `plan` says: "aggregate" before it
    sums the pushed gradients, "mid_optimizer" with half the new weights
    written (`dying_optimizer`)."""
    return dying_optimizer(inject_faults(ServerShard, plan, {"aggregate": "apply_gradients"}), plan)


def _grads(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(N).astype(np.float32) for _ in range(PUSHES)]


def _server(system: ActorSystem, plan: Plan, consistency: Consistency) -> Any:
    init = np.linspace(-1, 1, N, dtype=np.float32)
    return system.spawn(
        Props(
            faulty_server(plan),
            init,
            OptimizerKind.adam(0.01),
            consistency=consistency,
            workers=1,
        )
    )


async def _push(server: Any, grad: np.ndarray) -> int:
    _weights, version = await server.ask(PullWeights(0), timeout=T)
    return await server.ask(PushGradient(0, version, grad), timeout=T)


@pytest.mark.parametrize(
    "consistency", [Consistency.asynchronous(), Consistency.synchronous()], ids=["async", "sync"]
)
@pytest.mark.parametrize("phase", ["aggregate", "mid_optimizer"])
async def test_a_server_fault_changes_nothing_and_serving_continues(
    actor_system: ActorSystem, phase: str, consistency: Consistency
) -> None:
    plan = Plan()
    server = _server(actor_system, plan, consistency)
    grads = _grads()
    error: BaseException | None = None
    for i, g in enumerate(grads):
        if i == FAULT_AT:
            before = await server.ask(GetWeights(), timeout=T)
            _w, version_before = await server.ask(PullWeights(0), timeout=T)
            plan.arm(phase)
            with pytest.raises(Exception, match="injected") as info:
                await _push(server, g)
            error = info.value
            if consistency.is_synchronous:  # the round failed here, caused by the fault
                assert isinstance(error, RoundFailedError)
                error = error.__cause__
            assert isinstance(error, ContextPoisoned)
            np.testing.assert_array_equal(await server.ask(GetWeights(), timeout=T), before)
            _w, version_after = await server.ask(PullWeights(0), timeout=T)
            assert version_after == version_before
        else:
            await _push(server, g)
    assert error is not None and plan.fired == [phase]
    clean = _server(actor_system, Plan(), consistency)
    for i, g in enumerate(grads):
        if i != FAULT_AT:
            await _push(clean, g)
    np.testing.assert_allclose(
        await server.ask(GetWeights(), timeout=T),
        await clean.ask(GetWeights(), timeout=T),
        atol=1e-6,
    )


_ARMED = threading.Event()
_TIMEOUT, _HELD_FOR = 1.0, 1.5  # past the ask's timeout, within the fence's


@register_layer
class _HeldOnce(Layer):
    """Identity; when armed, its next forward takes `_HELD_FOR` seconds."""

    kind = "test_ps_held_once"

    def out_shape(self, in_shape: tuple[int, ...]) -> tuple[int, ...]:
        return in_shape

    def forward(self, backend: Any, params: Any, x: Any, ctx: Any) -> tuple[Any, Any]:
        if _ARMED.is_set():
            _ARMED.clear()
            time.sleep(_HELD_FOR)
        return x, None

    def backward(
        self,
        backend: Any,
        params: Any,
        grads: Any,
        saved: Any,
        dy: Any,
        accumulate: bool,
        input_grad: bool,
    ) -> Any:
        return dy if input_grad else None

    def config(self) -> dict[str, Any]:
        return {"kind": self.kind}


@pytest.mark.parametrize("synchronous", [True, False])
async def test_a_worker_slower_than_its_timeout_is_not_sent_its_part_again(
    synchronous: bool,
) -> None:
    """A timed-out part was sent again while the worker was still on it (its
    gradient pushed twice or more), and a synchronous server stayed a round
    out of step: every later Step timed out for good. The trainer now waits
    (up to the timeout again) for the held worker before it answers."""
    model = Sequential([Linear(5, 6), _HeldOnce(), Activation("tanh"), Linear(6, 3)], (5,), seed=0)
    config = TrainerConfig(OptimizerKind.sgd(0.1), LossKind.CROSS_ENTROPY, worker_timeout=_TIMEOUT)
    consistency = Consistency.synchronous() if synchronous else Consistency.asynchronous()
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((6, 5)).astype(np.float32), rng.integers(0, 3, 6)
    async with ActorSystem("ps-slow") as system:
        options = ParameterServerOptions(workers=2, consistency=consistency)
        ps = await AsyncParameterServer.spawn(system, model, cpu_devices(2), config, options)
        await ps.ask(Step(x, y), timeout=T)
        _ARMED.set()
        with pytest.raises(AskTimeoutError):
            await ps.ask(Step(x, y), timeout=T)
        before = (await ps.ask(GetServerStats(), timeout=T))[0].version
        for _ in range(3):  # every later step is whole again
            assert (await ps.ask(Step(x, y), timeout=T)).applied
        after = (await ps.ask(GetServerStats(), timeout=T))[0].version
        # one version per synchronous round, one per push otherwise; the held
        # part's single late push may land after `before` was read: applied
        # (asynchronous), or completing its own round (synchronous: a push of
        # an earlier round never joins a later one, test_server.py)
        assert after - before in ((3, 4) if synchronous else (6, 7))


class _NotedPushes(ServerShard):
    """A server shard that notes every `PushGradient` it answered."""

    pushes = 0

    async def receive(self, message: Any) -> Any:
        answer = await super().receive(message)
        if isinstance(message, PushGradient):
            type(self).pushes += 1
        return answer


@pytest.mark.parametrize(
    ("synchronous", "dtype"), [(True, np.float32), (False, np.float32), (False, np.float64)]
)
async def test_a_batch_refilled_after_its_timed_out_step_answers_trains_as_it_was_sent(
    synchronous: bool, dtype: type
) -> None:
    """A `Step` whose worker outlived its timeout (and the fence after it)
    answered `AskTimeoutError` while the worker had not yet read its part:
    a loader that refilled its buffer once the `Step` answered had the late
    push computed from the refill (its gradient applied all the same).
    float64 features (cast to float32 by validation: kept, not copied again)
    too."""
    plan = Plan()
    worker = inject_faults(ParameterServerWorker, plan, {"held": TrainBatch})
    config = TrainerConfig(OptimizerKind.sgd(0.5), LossKind.CROSS_ENTROPY, worker_timeout=0.25)
    consistency = Consistency.synchronous() if synchronous else Consistency.asynchronous()
    options = ParameterServerOptions(
        workers=1, consistency=consistency, worker_class=worker, server_class=_NotedPushes
    )
    rng = np.random.default_rng(3)
    sent = rng.standard_normal((8, 5)).astype(dtype), rng.integers(0, 3, 8)

    async def trained(refill: bool) -> np.ndarray:
        x, y = sent[0].copy(), sent[1].copy()
        _NotedPushes.pushes = 0
        async with ActorSystem("ps-refilled") as system:
            model = Mlp([5, 4, 3], seed=2)
            ps = await AsyncParameterServer.spawn(system, model, cpu_devices(1), config, options)
            # the worker wakes well after the Step's timeout and its fence (0.25 s each)
            plan.arm("held", None, delay=2.0)
            with pytest.raises(AskTimeoutError):
                await ps.ask(Step(x, y), timeout=T)
            if refill:
                x[:], y[:] = 0.0, 0
            await await_condition(lambda: _NotedPushes.pushes == 1, timeout=T)
            weights: np.ndarray = await ps.ask(GetWeights(), timeout=T)
        return weights

    np.testing.assert_array_equal(await trained(refill=True), await trained(refill=False))


FAULTY_SHARD = 1


@pytest.mark.parametrize(
    ("workers", "consistency", "trigger", "message"),
    [
        (2, Consistency.synchronous(), Evaluate(*held_out()), PullWeights),
        (1, Consistency.asynchronous(), None, PullWeights),
        (2, Consistency.synchronous(), None, PushGradient),
        (1, Consistency.bounded(1), None, PushGradient),
    ],
    ids=["sync-evaluate", "async-step", "sync-mid-round", "bounded-push"],
)
async def test_a_restarted_server_shard_refuses_until_a_checkpoint_is_loaded(
    actor_system: ActorSystem,
    tmp_path: Path,
    workers: int,
    consistency: Consistency,
    trigger: Evaluate | None,
    message: type,
) -> None:
    """Shard 1's device context is poisoned while it serves a pull or a push
    (outside its update): it is restarted with its initial weights and the
    spawn config's optimizer. The trainer used to go on from there, silently
    (the worker was sent its part again and trained it on the reset shard);
    now that request and every later one fail with `WorkerStateLost` naming
    the shard until a checkpoint is loaded, and then it trains as a
    single-device `Trainer` loaded from the same checkpoint (synchronous
    rounds, or one asynchronous worker, equal its steps). The pull is a
    `Step`'s in the asynchronous model, an `Evaluate`'s in the synchronous
    one (whose steps start from the weights their last push returned).

    Restarted mid-round (its first push of a synchronous round), the shard
    comes back with an empty round: a worker's part sent again used to
    abort into that round and wait there for the other worker's push, which
    had already been answered, until `worker_timeout` (here longer than the
    test's ask timeout); now the restarted shard refuses every push, abort
    and pull at once until it is given a state, and the request fails
    promptly."""
    plan = Plan()
    phase = "pull" if message is PullWeights else "push"
    shard = inject_faults(NumberedShard, plan, {phase: message}, worker=FAULTY_SHARD)
    config = TrainerConfig(OptimizerKind.adam(0.05), LossKind.CROSS_ENTROPY)
    model = Mlp(TWO_RANGE_SIZES, activation="tanh", seed=4)
    assert model.n_params == 2 * FIRST_RANGE - 1
    options = ParameterServerOptions(
        workers=workers, shards=2, consistency=consistency, server_class=shard
    )
    ps = await AsyncParameterServer.spawn(
        actor_system, model, cpu_devices(workers), config, options
    )
    single = await Trainer.spawn(actor_system, model, "cpu:0", config)
    await lost_until_reloaded(
        ps,
        single,
        batches(),
        plan,
        phase,
        "server shard",
        FAULTY_SHARD,
        tmp_path,
        trigger,
        grad_norm=workers == 1,  # else the parts' weighted norms: an upper bound
    )


def _pulling_after(plan: Plan) -> type[ParameterServerWorker]:
    """A worker class whose worker 1 starts its part only once `plan` fired
    (its pull then reaches a shard already restarted)."""

    class PullingAfter(ParameterServerWorker):
        async def receive(self, message: Any) -> Any:
            if isinstance(message, TrainBatch) and self.worker_id == 1:
                await await_condition(lambda: bool(plan.fired), timeout=T, message="the fault")
            return await super().receive(message)

    return PullingAfter


async def test_a_shard_lost_on_a_push_fails_the_step_at_once_when_a_pull_meets_it(
    actor_system: ActorSystem, tmp_path: Path
) -> None:
    """Synchronous, two workers, two shards: shard 0's device context is
    poisoned by worker 0's push, which waits in shard 1's round; worker 1's
    pull then reaches the restarted shard 0 and is refused. The trainer
    withdraws worker 1 (shard 1 drops the round), but worker 0, failed by
    the poisoned shard, was sent its part again, refused as well, and
    withdrawn from the round that was over: shard 1 opened it anew and
    waited for worker 1 until `worker_timeout` (here longer than the test's
    ask timeout; 3 Steps in 40 of a fuzz run took their whole timeout). Now
    the `Step` fails at once with `WorkerStateLost`, and once a checkpoint
    is loaded the next one trains."""
    plan = Plan()
    shard = inject_faults(NumberedShard, plan, {"push": PushGradient}, worker=0)
    config = TrainerConfig(OptimizerKind.sgd(0.1), LossKind.CROSS_ENTROPY)
    assert config.worker_timeout is not None and config.worker_timeout > T
    options = ParameterServerOptions(
        workers=2,
        shards=2,
        consistency=Consistency.synchronous(),
        server_class=shard,
        worker_class=_pulling_after(plan),
    )
    model = Mlp(TWO_RANGE_SIZES, seed=4)
    ps = await AsyncParameterServer.spawn(actor_system, model, cpu_devices(2), config, options)
    await ps.ask(SaveCheckpoint(tmp_path / "start.ckpt"), timeout=T)
    (x, y), *_ = batches()
    plan.arm("push", ContextPoisoned)
    with pytest.raises(WorkerStateLost, match="server shard 0 lost"):
        await ps.ask(Step(x, y), timeout=T)
    assert plan.fired == ["push"]
    await ps.ask(LoadCheckpoint(tmp_path / "start.ckpt"), timeout=T)
    assert (await ps.ask(Step(x, y), timeout=T)).applied
