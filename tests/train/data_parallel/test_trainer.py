"""DataParallelTrainer: equal to the single-device Trainer on the whole batch
(N = 1..4 replicas, uneven shards, SGD-momentum and AdamW, both collectives),
replicas identical after every step, accumulation, small batches, bad input,
checkpoints, a user-written replica, speed balancing, injected faults and
the multi-process hook (a fake two-"process" collective)."""

from __future__ import annotations

import asyncio
import dataclasses
import math
from typing import Any

import numpy as np
import pytest

from atomr import Actor, ActorStoppedError, Props
from atomr.accel import ContextPoisoned, cpu_devices
from atomr.testkit import Plan, inject_faults
from atomr.train import (
    CheckpointError,
    DataParallelOptions,
    DataParallelTrainer,
    Evaluate,
    GetWeights,
    InvalidBatchError,
    LoadCheckpoint,
    LossKind,
    Mlp,
    OptimizerKind,
    SaveCheckpoint,
    Step,
    Trainer,
    TrainerConfig,
    load_checkpoint,
)
from atomr.train.comm import Collective
from atomr.train.core import synthetic_classification
from atomr.train.core.model import Activation, Dropout, Linear, Sequential
from atomr.train.data_parallel import (
    GetReplicaWeights,
    ReplicaActor,
    ReplicaDivergenceError,
    SetReplicas,
    SpeedBalancer,
)
from atomr.train.data_parallel.messages import (
    ApplyReducedGradients,
    ComputeGradients,
    EvaluateShard,
    GetState,
    GradientResult,
    ReplicaState,
    Rollback,
    SetState,
    ShardEval,
)

SIZES = [6, 5, 4, 3]
CE = LossKind.CROSS_ENTROPY
RTOL, ATOL = 2e-5, 2e-6  # float32: the split changes the order of the sums

OPTIMIZERS = {
    "sgd-momentum": OptimizerKind.sgd(0.2, momentum=0.9),
    "adamw": OptimizerKind.adamw(0.03),
}


def _data(n: int = 13, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    return synthetic_classification(n, SIZES[0], SIZES[-1], seed=seed)


def _config(opt: str = "sgd-momentum", **kw: Any) -> TrainerConfig:
    return TrainerConfig(OPTIMIZERS[opt], kw.pop("loss", CE), **kw)


async def _assert_replicas_identical(dp) -> np.ndarray:
    weights = await dp.ask(GetReplicaWeights(), timeout=10)
    for w in weights[1:]:
        np.testing.assert_array_equal(w, weights[0])
    return weights[0]


async def _compare(system, dp, ref, batches, applied_only: bool = False) -> None:
    """Step both trainers on each batch; weights equal, replicas identical."""
    for x, y in batches:
        a = await ref.ask(Step(x, y), timeout=10)
        b = await dp.ask(Step(x, y), timeout=10)
        assert b.applied == a.applied and b.samples == a.samples
        assert math.isclose(a.loss, b.loss, rel_tol=1e-5, abs_tol=1e-6)
        assert math.isclose(a.grad_norm, b.grad_norm, rel_tol=1e-4, abs_tol=1e-6)
        w = await _assert_replicas_identical(dp)
        np.testing.assert_allclose(w, await ref.ask(GetWeights()), rtol=RTOL, atol=ATOL)


# ---------------------------------------------------------------- equality


@pytest.mark.parametrize("collective", ["host", "ring"])
@pytest.mark.parametrize("opt", ["sgd-momentum", "adamw"])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
async def test_equals_single_device_trainer(actor_system, n: int, opt: str, collective: str):
    model = Mlp(SIZES, activation="tanh", seed=3)
    config = _config(opt)
    ref = await Trainer.spawn(actor_system, model, "cpu:0", config)
    dp = await DataParallelTrainer.spawn(
        actor_system,
        model,
        cpu_devices(n),
        config,
        options=DataParallelOptions(collective=collective),
    )
    # 13 rows: shards 13 / 7+6 / 5+4+4 / 4+3+3+3 (uneven)
    batches = [_data(13, seed=s) for s in range(20)]
    await _compare(actor_system, dp, ref, batches)


@pytest.mark.parametrize("collective", ["host", "ring"])
async def test_clipping_mse_and_weighted_ce(actor_system, collective: str) -> None:
    model = Mlp(SIZES, seed=4)
    rng = np.random.default_rng(0)
    for loss in (LossKind.MSE, LossKind.weighted_cross_entropy([0.2, 1.0, 3.0])):
        config = TrainerConfig(OptimizerKind.sgd(0.3, momentum=0.5), loss, gradient_clip=0.05)
        ref = await Trainer.spawn(actor_system, model, "cpu:0", config)
        dp = await DataParallelTrainer.spawn(
            actor_system, model, cpu_devices(3), config, options=DataParallelOptions(collective)
        )
        batches = []
        for s in range(5):
            x, y = _data(11, seed=s)
            if loss is LossKind.MSE:
                y = rng.standard_normal((11, SIZES[-1])).astype(np.float32)
            batches.append((x, y))
        await _compare(actor_system, dp, ref, batches)
        stats = await dp.ask(Step(*batches[0]))
        assert stats.grad_norm > 0.05  # clipping was active


@pytest.mark.parametrize("collective", ["host", "ring"])
async def test_accumulation_equals_one_step_on_the_k_fold_batch(actor_system, collective: str):
    model = Mlp(SIZES, seed=5)
    k = 3
    big = TrainerConfig(OPTIMIZERS["adamw"], CE)
    acc = TrainerConfig(OPTIMIZERS["adamw"], CE, accumulation_steps=k)
    ref = await Trainer.spawn(actor_system, model, "cpu:0", big)
    dp = await DataParallelTrainer.spawn(
        actor_system, model, cpu_devices(2), acc, options=DataParallelOptions(collective)
    )
    for step in range(4):
        micro = [_data(7 + i, seed=10 * step + i) for i in range(k)]  # uneven micro-batches
        start = await _assert_replicas_identical(dp)
        for i, (x, y) in enumerate(micro):
            stats = await dp.ask(Step(x, y))
            assert stats.applied == (i == k - 1)
            if i < k - 1:  # nothing synchronised, nothing applied
                np.testing.assert_array_equal(await dp.ask(GetWeights()), start)
        x_all = np.concatenate([m[0] for m in micro])
        y_all = np.concatenate([m[1] for m in micro])
        expected = await ref.ask(Step(x_all, y_all))
        assert math.isclose(stats.loss, expected.loss, rel_tol=1e-5)
        w = await _assert_replicas_identical(dp)
        np.testing.assert_allclose(w, await ref.ask(GetWeights()), rtol=RTOL, atol=ATOL)


class RecordingReplica(ReplicaActor):
    """Appends the rows of every shard it is asked to compute to `log` (shared
    with the test). With `micros_per_row`, it reports that fixed device time
    per row instead of the measured one: a device of known, steady speed, so
    that the speed balancer sees exact numbers and no wall-clock time."""

    def __init__(self, model, device, config, log: list[int], micros_per_row: int | None = None):
        super().__init__(model, device, config)
        self.log = log
        self.micros_per_row = micros_per_row

    def compute_gradients(self, msg):
        result = super().compute_gradients(msg)
        self.log.append(int(msg.features.shape[0]))
        if self.micros_per_row is None or not isinstance(result, GradientResult):
            return result
        return dataclasses.replace(result, micros=self.micros_per_row * result.samples)


@pytest.mark.parametrize("collective", ["host", "ring"])
async def test_batch_smaller_than_replicas_leaves_the_last_shards_empty(
    actor_system, collective: str
):
    """Every replica is still asked, the last ones with an empty shard (the
    `split_sizes` sizes), and the step still equals the single-device one."""
    model = Mlp(SIZES, seed=6)
    config = _config("sgd-momentum")
    ref = await Trainer.spawn(actor_system, model, "cpu:0", config)
    logs: list[list[int]] = [[] for _ in range(4)]
    props = [
        Props(RecordingReplica, model, dev, config, log)
        for dev, log in zip(cpu_devices(4), logs, strict=True)
    ]
    options = DataParallelOptions(collective)
    dp = actor_system.spawn(DataParallelTrainer.props(config, props, options=options))
    await _compare(actor_system, dp, ref, [_data(2, seed=1), _data(1, seed=2), _data(9, seed=3)])
    # rows per replica for batches of 2, 1 and 9 rows
    assert logs == [[1, 1, 3], [1, 0, 2], [0, 0, 2], [0, 0, 2]]


async def test_initial_weights_are_broadcast_from_replica_0(actor_system) -> None:
    config = _config()
    props = [ReplicaActor.props(Mlp(SIZES, seed=s), "cpu:0", config) for s in (10, 11, 12)]
    dp = actor_system.spawn(DataParallelTrainer.props(config, props))
    w = await _assert_replicas_identical(dp)
    np.testing.assert_array_equal(w, Mlp(SIZES, seed=10).get_params())
    ref = await Trainer.spawn(actor_system, Mlp(SIZES, seed=10), "cpu:0", config)
    await _compare(actor_system, dp, ref, [_data(10, seed=s) for s in range(3)])


# ---------------------------------------------------------------- API and errors


async def test_bad_input_is_answered_and_changes_nothing(actor_system) -> None:
    model = Mlp(SIZES, seed=7)
    dp = await DataParallelTrainer.spawn(actor_system, model, cpu_devices(2), _config())
    before = await dp.ask(GetWeights())
    x, y = _data(8)
    with pytest.raises(InvalidBatchError, match="width"):
        await dp.ask(Step(x[:, :4], y))
    with pytest.raises(InvalidBatchError, match="labels must be in"):
        await dp.ask(Step(x, y + 10))
    bad = x.copy()
    bad[0, 0] = np.nan
    with pytest.raises(InvalidBatchError, match="NaN"):
        await dp.ask(Step(bad, y))
    with pytest.raises(TypeError, match="does not handle"):
        await dp.ask("hello")
    np.testing.assert_array_equal(await dp.ask(GetWeights()), before)
    await dp.ask(Step(x, y))  # still alive, still working


_DEVICES = cpu_devices(2)

# (argument overrides, error, what the message names)
SPAWN_MISTAKES = {
    "system": ({"system": "sys"}, TypeError, "system"),
    "model": ({"model": "model"}, TypeError, "model"),
    "lone device": ({"devices": "cpu:0"}, TypeError, "devices"),
    "no devices": ({"devices": []}, ValueError, "at least one device"),
    "device type": ({"devices": ["cpu:0", 3]}, TypeError, "devices\\[1\\]"),
    "device name": ({"devices": ["gpu:0"]}, ValueError, "unknown device"),
    "cpu and cuda": ({"devices": ["cpu:0", "cuda:0"]}, ValueError, "mix CPU and CUDA"),
    "config": ({"config": {"lr": 0.1}}, TypeError, "config"),
    "options type": ({"options": _config()}, TypeError, "options"),
    "speed hint": (
        {"options": DataParallelOptions(balance=True, speed_hint=(1, 2, 3))},
        ValueError,
        "speed_hint",
    ),
    "name": ({"name": 3}, TypeError, "name"),
}


@pytest.mark.parametrize("mistake", list(SPAWN_MISTAKES))
async def test_spawn_argument_mistakes_raise_before_anything_is_spawned(
    actor_system, mistake: str
) -> None:
    given, error, names = SPAWN_MISTAKES[mistake]
    args = {"system": actor_system, "model": Mlp(SIZES), "devices": _DEVICES}
    args |= {"config": _config(), "options": None, "name": None} | given
    before = actor_system.actors
    with pytest.raises(error, match=names):
        await DataParallelTrainer.spawn(**args)
    assert actor_system.actors == before


PROPS_MISTAKES = {
    "config": ({"config": None}, TypeError, "config"),
    "replicas type": ({"replicas": 3}, TypeError, "replicas"),
    "replica type": ({"replicas": ["cpu:0"]}, TypeError, "replicas\\[0\\]"),
    "options type": ({"options": "ring"}, TypeError, "options"),
    "speed hint": (
        {"options": DataParallelOptions(balance=True, speed_hint=(1.0,))},
        ValueError,
        "speed_hint",
    ),
}


@pytest.mark.parametrize("mistake", list(PROPS_MISTAKES))
def test_props_argument_mistakes_raise(mistake: str) -> None:
    given, error, names = PROPS_MISTAKES[mistake]
    replicas = [ReplicaActor.props(Mlp(SIZES), d, _config()) for d in _DEVICES]
    args = {"config": _config(), "replicas": replicas, "options": None} | given
    with pytest.raises(error, match=names):
        DataParallelTrainer.props(**args)


async def test_a_trainer_without_replicas_refuses_steps(actor_system) -> None:
    dp = actor_system.spawn(DataParallelTrainer.props(_config()))
    with pytest.raises(RuntimeError, match="no replicas"):
        await dp.ask(Step(*_data()))


async def test_replica_refuses_step(actor_system) -> None:
    rep = actor_system.spawn(ReplicaActor.props(Mlp(SIZES), "cpu:0", _config()))
    with pytest.raises(TypeError, match="ReplicaActor does not handle Step; step its trainer"):
        await rep.ask(Step(*_data()))
    # an unknown message: no trainer's hint at Step, which a replica refuses
    with pytest.raises(TypeError, match=r"^ReplicaActor does not handle str$"):
        await rep.ask("hello")


async def test_late_binding_with_set_replicas(actor_system) -> None:
    config = _config()
    reps = [
        actor_system.spawn(ReplicaActor.props(Mlp(SIZES, seed=s), "cpu:0", config)) for s in (1, 2)
    ]
    dp = actor_system.spawn(DataParallelTrainer.props(config))
    await dp.ask(SetReplicas(reps))
    w = await _assert_replicas_identical(dp)
    np.testing.assert_array_equal(w, Mlp(SIZES, seed=1).get_params())
    ref = await Trainer.spawn(actor_system, Mlp(SIZES, seed=1), "cpu:0", config)
    await _compare(actor_system, dp, ref, [_data(9, seed=s) for s in range(3)])


async def test_evaluate_equals_trainer(actor_system) -> None:
    model = Mlp(SIZES, seed=8)
    config = _config()
    ref = await Trainer.spawn(actor_system, model, "cpu:0", config)
    dp = await DataParallelTrainer.spawn(actor_system, model, cpu_devices(3), config)
    x, y = _data(17, seed=4)
    a = await ref.ask(Evaluate(x, y))
    b = await dp.ask(Evaluate(x, y))
    assert math.isclose(a.loss, b.loss, rel_tol=1e-6) and a.accuracy == b.accuracy
    assert b.samples == 17


async def test_checkpoints_are_interchangeable_with_trainer(actor_system, tmp_path) -> None:
    model = Mlp(SIZES, seed=9)
    config = _config("adamw")
    ref = await Trainer.spawn(actor_system, model, "cpu:0", config)
    dp = await DataParallelTrainer.spawn(actor_system, model, cpu_devices(2), config)
    for s in range(3):
        await ref.ask(Step(*_data(seed=s)))
        await dp.ask(Step(*_data(seed=s)))
    # DP -> Trainer: a fresh Trainer resumes the DP run exactly
    await dp.ask(SaveCheckpoint(tmp_path / "dp.ckpt"))
    resumed = await Trainer.spawn(actor_system, Mlp(SIZES, seed=0), "cpu:0", config)
    await resumed.ask(LoadCheckpoint(tmp_path / "dp.ckpt"))
    np.testing.assert_array_equal(await resumed.ask(GetWeights()), await dp.ask(GetWeights()))
    # Trainer -> DP (fresh, other init): continues like the Trainer
    await ref.ask(SaveCheckpoint(tmp_path / "ref.ckpt"))
    dp2 = await DataParallelTrainer.spawn(actor_system, Mlp(SIZES, seed=1), cpu_devices(3), config)
    await dp2.ask(LoadCheckpoint(tmp_path / "ref.ckpt"))
    np.testing.assert_array_equal(await dp2.ask(GetWeights()), await ref.ask(GetWeights()))
    await _compare(actor_system, dp2, ref, [_data(seed=s) for s in range(3, 6)])
    # a checkpoint of another model is refused and changes nothing
    other = await Trainer.spawn(actor_system, Mlp([6, 3]), "cpu:0", config)
    await other.ask(SaveCheckpoint(tmp_path / "other.ckpt"))
    before = await dp2.ask(GetWeights())
    with pytest.raises(CheckpointError):
        await dp2.ask(LoadCheckpoint(tmp_path / "other.ckpt"))
    np.testing.assert_array_equal(await dp2.ask(GetWeights()), before)


async def test_a_save_inside_an_accumulation_window_resumes_it_on_either_trainer(
    actor_system, tmp_path
) -> None:
    """Two micro-steps into a window of three, data parallel and one device
    save; each checkpoint loads into the other kind (another replica count,
    another initialisation), and the window's last step applies what it
    would have without the save."""
    config = TrainerConfig(OPTIMIZERS["adamw"], CE, accumulation_steps=3)
    data = [_data(seed=s) for s in range(6)]
    dp = await DataParallelTrainer.spawn(actor_system, Mlp(SIZES), cpu_devices(2), config)
    single = await Trainer.spawn(actor_system, Mlp(SIZES), "cpu:0", config)
    for batch in data[:2]:
        await dp.ask(Step(*batch))
        await single.ask(Step(*batch))
    await dp.ask(SaveCheckpoint(tmp_path / "dp.ckpt"))
    await single.ask(SaveCheckpoint(tmp_path / "single.ckpt"))
    saved = load_checkpoint(tmp_path / "dp.ckpt")
    assert saved.extra["micro"] == 2 and saved.extra["accum_samples"] == 26
    from_dp = await Trainer.spawn(actor_system, Mlp(SIZES, seed=5), "cpu:0", config)
    await from_dp.ask(LoadCheckpoint(tmp_path / "dp.ckpt"))
    from_single = await DataParallelTrainer.spawn(
        actor_system, Mlp(SIZES, seed=5), cpu_devices(3), config
    )
    await from_single.ask(LoadCheckpoint(tmp_path / "single.ckpt"))
    for batch in data[2:]:
        for trainer in (dp, single, from_dp, from_single):
            await trainer.ask(Step(*batch))
    want = await single.ask(GetWeights())
    for trainer in (dp, from_dp, from_single):
        np.testing.assert_allclose(await trainer.ask(GetWeights()), want, rtol=RTOL, atol=ATOL)
    assert not np.allclose(want, Mlp(SIZES).get_params())  # two windows were applied


async def test_a_window_of_micro_batches_with_dropout_is_the_step_on_their_batch(
    actor_system,
) -> None:
    """Each micro-batch's rows are rows of the window's one batch: dropout
    masks them as it would the concatenated batch, on one device and on
    replicas."""

    def model() -> Sequential:
        layers = [Linear(6, 16), Activation("tanh"), Dropout(0.5, seed=3), Linear(16, 3)]
        return Sequential(layers, (6,), seed=1)

    x, y = _data(n=24)
    whole = TrainerConfig(OptimizerKind.sgd(0.5), CE)
    windowed = TrainerConfig(OptimizerKind.sgd(0.5), CE, accumulation_steps=3)
    one_step = await Trainer.spawn(actor_system, model(), "cpu:0", whole)
    await one_step.ask(Step(x, y))
    want = await one_step.ask(GetWeights())
    single = await Trainer.spawn(actor_system, model(), "cpu:0", windowed)
    dp = await DataParallelTrainer.spawn(actor_system, model(), cpu_devices(2), windowed)
    for lo in range(0, 24, 8):
        await single.ask(Step(x[lo : lo + 8], y[lo : lo + 8]))
        await dp.ask(Step(x[lo : lo + 8], y[lo : lo + 8]))
    np.testing.assert_allclose(await single.ask(GetWeights()), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(await dp.ask(GetWeights()), want, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- user-written replica


class NumpyReplica(Actor):
    """A replica written against ReplicaProtocol only (not a ReplicaActor)."""

    def __init__(self, sizes: list[int], seed: int, config: TrainerConfig) -> None:
        super().__init__()
        self.model = Mlp(sizes, activation="relu", seed=seed)
        self.config = config
        self.opt = config.optimizer.create(self.model.n_params)
        self.steps = 0
        self.snapshot: tuple[int, np.ndarray, dict] | None = None

    def receive(self, msg: Any) -> Any:
        m, be = self.model, self.model.backend
        if isinstance(msg, ComputeGradients):
            n = msg.features.shape[0]
            loss, norm = 0.0, 0.0
            if n:
                tape = m.forward_train(np.ascontiguousarray(msg.features, np.float32))
                d = np.empty_like(tape.output)
                loss, norm = self.config.loss.sums(be, tape.output, msg.labels, d)
                m.backward(tape, d, accumulate=msg.accumulate)
            elif not msg.accumulate:
                m.zero_grads()
            return GradientResult(loss, norm, n, 1, m.grads if msg.return_gradients else None)
        if isinstance(msg, ApplyReducedGradients):
            assert msg.gradients is not None, "this replica only supports the host collective"
            self.snapshot = (msg.token, m.get_params(), self.opt.state_dict())
            self.opt.step(m.params, msg.gradients)
            self.steps += 1
            return None
        if isinstance(msg, Rollback):
            if self.snapshot is None or self.snapshot[0] != msg.token:
                return False
            m.set_params(self.snapshot[1])
            self.opt.load_state_dict(self.snapshot[2])
            self.steps -= 1
            return True
        if isinstance(msg, GetState):
            return ReplicaState(m.config(), m.get_params(), self.opt.state_dict(), self.steps)
        if isinstance(msg, SetState):
            m.set_params(msg.state.weights)
            self.opt = self.config.optimizer.create(m.n_params)
            if msg.state.optimizer:
                self.opt.load_state_dict(msg.state.optimizer)
            self.steps = msg.state.steps
            return None
        if isinstance(msg, GetWeights):
            return m.get_params()
        if isinstance(msg, EvaluateShard):
            out = m.forward(np.ascontiguousarray(msg.features, np.float32))
            loss, norm = self.config.loss.sums(be, out, msg.labels, np.empty_like(out))
            return ShardEval(loss, norm, int((out.argmax(1) == msg.labels).sum()), len(out))
        raise TypeError(f"unexpected {msg!r}")


async def test_user_written_replica(actor_system) -> None:
    config = _config("sgd-momentum")
    reps = [actor_system.spawn(Props(NumpyReplica, SIZES, seed, config)) for seed in (21, 22, 23)]
    dp = actor_system.spawn(DataParallelTrainer.props(config, reps))
    ref = await Trainer.spawn(actor_system, Mlp(SIZES, seed=21), "cpu:0", config)
    await _compare(actor_system, dp, ref, [_data(14, seed=s) for s in range(10)])


# ---------------------------------------------------------------- balancing


def test_speed_balancer_split() -> None:
    b = SpeedBalancer(2, enabled=True, speed_hint=[1, 3], recalibrate_every=2, min_share=0.1)
    assert b.split(100) == [25, 75]
    assert sum(b.split(7)) == 7 and min(b.split(7)) >= 1
    # replica 1 measured 4x slower than replica 0 (same samples, 4x the time)
    b.record([50, 50], [1000, 4000])
    assert b.split(100) == [25, 75]  # not yet recalibrated
    b.record([50, 50], [1000, 4000])
    assert b.split(100) == [80, 20]
    # the minimum share holds even for a very slow replica
    b.record([50, 50], [1, 10**9])
    b.record([50, 50], [1, 10**9])
    assert b.split(100)[1] >= 10
    assert SpeedBalancer(3).split(10) == [4, 3, 3]  # off: even
    with pytest.raises(ValueError):
        SpeedBalancer(2, speed_hint=[1.0])
    with pytest.raises(ValueError):
        SpeedBalancer(2, min_share=0.6)
    with pytest.raises(ValueError):
        SpeedBalancer(2).split(0)


@pytest.mark.parametrize("collective", ["host", "ring"])
async def test_balanced_split_follows_speed_and_stays_exact(actor_system, collective: str):
    """Replica 1 reports 4x the device time per row of replica 0 (fixed
    numbers, no sleeping); after `recalibrate_every` steps the split moves to
    4:1 and every step still equals the single-device trainer."""
    model = Mlp(SIZES, seed=12)
    config = _config("adamw")
    fast: list[int] = []
    slow: list[int] = []
    props = [
        Props(RecordingReplica, model, "cpu:0", config, fast, 100),
        Props(RecordingReplica, model, "cpu:1", config, slow, 400),
    ]
    options = DataParallelOptions(
        collective, balance=True, speed_hint=(1.0, 1.0), recalibrate_every=2, min_share=0.1
    )
    dp = actor_system.spawn(DataParallelTrainer.props(config, props, options=options))
    ref = await Trainer.spawn(actor_system, model, "cpu:0", config)
    await _compare(actor_system, dp, ref, [_data(40, seed=s) for s in range(8)])
    # even from the hint for 2 steps, then in proportion to the reported speed
    assert fast == [20, 20] + [32] * 6, fast
    assert slow == [20, 20] + [8] * 6, slow


# ---------------------------------------------------------------- faults


class CorruptingReplica(ReplicaActor):
    """A replica whose device dies after an apply, leaving garbage weights,
    when `plan` (shared with the test) has "apply" armed."""

    def __init__(self, model, device, config, plan: Plan) -> None:
        super().__init__(model, device, config)
        self.plan = plan

    def apply_gradients(self, msg):
        result = super().apply_gradients(msg)  # applied (and snapshotted) ...
        if self.plan.armed("apply"):
            assert self.model is not None
            self.model.params[:] = 1e6  # ... then the device dies mid-way
            self.plan.fire("apply")
        return result


def flaky_replica(plan: Plan) -> type[CorruptingReplica]:
    """`CorruptingReplica` whose device also fails, when `plan` says, in the
    gradient computation ("compute") or in the ring's add of a chunk ("ring")."""
    plan.declare("apply")  # `CorruptingReplica.apply_gradients` checks it
    return inject_faults(
        CorruptingReplica, plan, {"compute": "compute_gradients", "ring": "add_chunk"}
    )


@pytest.mark.parametrize(
    ("phase", "collective"),
    [
        ("compute", "host"),
        ("compute", "ring"),
        ("apply", "host"),
        ("apply", "ring"),
        ("ring", "ring"),
    ],
)
async def test_replica_failure_abandons_the_step(actor_system, phase: str, collective: str):
    model = Mlp(SIZES, seed=13)
    config = _config("sgd-momentum")
    plan = Plan()
    props = [
        ReplicaActor.props(model, "cpu:0", config),
        Props(flaky_replica(plan), Mlp(SIZES, seed=99), "cpu:1", config, plan),  # other init
        ReplicaActor.props(model, "cpu:2", config),
    ]
    dp = actor_system.spawn(
        DataParallelTrainer.props(config, props, options=DataParallelOptions(collective))
    )
    ref = await Trainer.spawn(actor_system, model, "cpu:0", config)
    await _compare(actor_system, dp, ref, [_data(12, seed=0), _data(12, seed=1)])
    before = await _assert_replicas_identical(dp)
    plan.arm(phase, ContextPoisoned)
    with pytest.raises(ContextPoisoned, match="injected"):
        await dp.ask(Step(*_data(12, seed=2)), timeout=20)
    assert plan.fired == [phase]
    # nobody applied anything; the failed replica was restarted and re-synced
    after = await _assert_replicas_identical(dp)
    np.testing.assert_array_equal(after, before)
    # the next steps work and still equal the reference (momentum state included)
    await _compare(actor_system, dp, ref, [_data(12, seed=s) for s in range(3, 6)])


async def test_divergence_check_fails_loudly(actor_system) -> None:
    config = _config()
    model = Mlp(SIZES, seed=14)
    replicas = [actor_system.spawn(ReplicaActor.props(model, d, config)) for d in cpu_devices(2)]
    options = DataParallelOptions(check_every=2)
    dp = actor_system.spawn(DataParallelTrainer.props(config, replicas, options))
    await dp.ask(Step(*_data()))
    await dp.ask(Step(*_data()))  # the check runs and passes
    state = await replicas[1].ask(GetState())  # corrupt one replica
    await replicas[1].ask(SetState(ReplicaState(state.model, state.weights + 1.0, state.optimizer)))
    await dp.ask(Step(*_data()))
    with pytest.raises(ReplicaDivergenceError, match="replicas \\[1\\]"):
        await dp.ask(Step(*_data()))


@pytest.mark.parametrize("kind", [OptimizerKind.adam(0.01).to_config(), 5])
async def test_a_replica_refuses_optimizer_state_that_does_not_fit_naming_itself(
    actor_system, kind: Any
) -> None:
    """`SetState` checks optimizer state by the rule a checkpoint load uses
    (`restored_optimizer`): state of another kind, or a malformed kind, is a
    `CheckpointError` that names the replica, and its weights stay."""
    props = ReplicaActor.props(Mlp(SIZES, seed=2), "cpu:0", _config(), index=1)
    replica = actor_system.spawn(props)
    state = await replica.ask(GetState())
    bad = ReplicaState(state.model, state.weights + 1.0, {"kind": kind, "step": 0})
    with pytest.raises(CheckpointError, match="^replica 1: optimizer state does not fit"):
        await replica.ask(SetState(bad))
    np.testing.assert_array_equal((await replica.ask(GetState())).weights, state.weights)


# ---------------------------------------------------------------- several processes


class FakeProcessGroup:
    """Simulates `world` processes in one: each rank's calls meet by sequence number."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.ops: dict[int, dict[str, Any]] = {}

    def rank(self, r: int) -> Collective:
        return _FakeRank(self, r)


class _FakeRank(Collective):
    def __init__(self, group: FakeProcessGroup, rank: int) -> None:
        self.group, self.r, self.seq = group, rank, 0
        self.calls: list[str] = []

    async def _meet(self, kind: str, buf: np.ndarray) -> dict[int, np.ndarray]:
        self.calls.append(kind)
        op = self.group.ops.setdefault(self.seq, {"bufs": {}, "done": asyncio.Event()})
        self.seq += 1
        op["bufs"][self.r] = buf.copy()
        if len(op["bufs"]) == self.group.world:
            op["done"].set()
        await asyncio.wait_for(op["done"].wait(), 10)
        return op["bufs"]

    async def all_reduce(self, buffers):
        target = buffers[0]
        for extra in buffers[1:]:
            target += extra
        bufs = await self._meet("all_reduce", target)
        total = bufs[0].copy()
        for r in range(1, self.group.world):
            total += bufs[r]
        np.copyto(target, total)
        return target

    async def broadcast(self, buffers, root=0):
        bufs = await self._meet("broadcast", buffers[0])
        for b in buffers:
            np.copyto(b, bufs[root])

    async def barrier(self):
        await self._meet("barrier", np.zeros(1))

    async def reduce_scatter(self, buffers):
        raise NotImplementedError("the data-parallel trainer does not reduce-scatter")

    async def all_gather(self, buffers):
        raise NotImplementedError("the data-parallel trainer does not all-gather")


@pytest.mark.parametrize("collectives", [("host", "host"), ("ring", "host")])
async def test_two_processes_equal_one_device_on_the_global_batch(actor_system, collectives):
    """2 "processes" x 2 local replicas == one device on the global batch:
    each process is sent the whole batch and trains on its `shard_for_rank` share."""
    config = _config("adamw", gradient_clip=0.5)
    group = FakeProcessGroup(2)
    ranks = [group.rank(0), group.rank(1)]
    trainers = await asyncio.gather(
        *(
            DataParallelTrainer.spawn(
                actor_system,
                Mlp(SIZES, seed=30 + r),  # rank 1 starts elsewhere: rank 0's weights win
                cpu_devices(2),
                config,
                DataParallelOptions(
                    collectives[r], process_collective=ranks[r], process_rank=r, process_count=2
                ),
            )
            for r in range(2)
        )
    )
    ref = await Trainer.spawn(actor_system, Mlp(SIZES, seed=30), "cpu:0", config)
    for s in range(6):
        x, y = _data(15 + s, seed=s)  # odd sizes: the processes' shares differ by one
        a = await ref.ask(Step(x, y))
        b0, b1 = await asyncio.gather(trainers[0].ask(Step(x, y)), trainers[1].ask(Step(x, y)))
        assert b0.samples == b1.samples == a.samples == 15 + s
        assert math.isclose(b0.loss, a.loss, rel_tol=1e-5) and b0.loss == b1.loss
        assert math.isclose(b0.grad_norm, a.grad_norm, rel_tol=1e-4)
        w0 = await _assert_replicas_identical(trainers[0])
        w1 = await _assert_replicas_identical(trainers[1])
        np.testing.assert_array_equal(w0, w1)
        np.testing.assert_allclose(w0, await ref.ask(GetWeights()), rtol=RTOL, atol=ATOL)
    # the processes agree that every one started (an all-reduce), then take rank 0's weights
    assert ranks[0].calls[:3] == ["all_reduce", "broadcast", "all_reduce"]


async def test_only_process_0_writes_checkpoints_and_every_process_loads(
    actor_system, tmp_path
) -> None:
    config = _config("adamw")
    group = FakeProcessGroup(2)
    trainers = await asyncio.gather(
        *(
            DataParallelTrainer.spawn(
                actor_system,
                Mlp(SIZES, seed=40 + r),
                cpu_devices(2),
                config,
                DataParallelOptions(
                    process_collective=group.rank(r), process_rank=r, process_count=2
                ),
            )
            for r in range(2)
        )
    )
    x, y = _data(12, seed=1)
    await asyncio.gather(*(t.ask(Step(x, y)) for t in trainers))
    paths = [tmp_path / "ckpt.atomr", tmp_path / "from-rank-1.atomr"]
    await asyncio.gather(*(t.ask(SaveCheckpoint(p)) for t, p in zip(trainers, paths, strict=True)))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.atomr"]  # rank 1 wrote nothing
    saved = await trainers[0].ask(GetWeights())
    await asyncio.gather(*(t.ask(Step(x, y)) for t in trainers))  # move away from it
    await asyncio.gather(*(t.ask(LoadCheckpoint(paths[0])) for t in trainers))
    for t in trainers:
        np.testing.assert_array_equal(await _assert_replicas_identical(t), saved)


async def test_a_replica_failing_to_start_on_one_process_fails_every_processs_spawn(
    actor_system,
) -> None:
    """Rank 1's replica 1 cannot start: both spawns fail before the weight
    broadcast (rank 0 with an error naming rank 1, not the group's timeout),
    and neither leaves a trainer or replica running."""
    plan = Plan()
    faulty = inject_faults(ReplicaActor, plan, {"start": "pre_start"}, worker=1)
    plan.arm("start", RuntimeError)
    group = FakeProcessGroup(2)
    ranks = [group.rank(0), group.rank(1)]
    spawned = await asyncio.gather(
        *(
            DataParallelTrainer.spawn(
                actor_system,
                Mlp(SIZES, seed=50),
                cpu_devices(2),
                _config("adamw"),
                DataParallelOptions(
                    process_collective=ranks[r],
                    process_rank=r,
                    process_count=2,
                    replica_class=faulty if r == 1 else ReplicaActor,
                ),
            )
            for r in range(2)
        ),
        return_exceptions=True,
    )
    assert plan.fired == ["start"]
    assert isinstance(spawned[0], RuntimeError), spawned[0]
    assert "process rank 1 failed to start its trainer" in str(spawned[0])
    assert isinstance(spawned[1], ActorStoppedError), spawned[1]  # its replica 1 is gone
    assert "on process rank 1" in " ".join(spawned[1].__notes__)
    assert ranks[0].calls == ["all_reduce"]  # no broadcast
    assert actor_system.actors == []
