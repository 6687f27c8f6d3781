"""TensorParallelTrainer: sharded output and gradients equal the unsharded
model's; training, checkpoints, atomic steps and bad input equal / match the
single-device Trainer."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from atomr import ActorSystem
from atomr.accel import OutOfMemory
from atomr.train import (
    CheckpointError,
    Evaluate,
    GetWeights,
    InvalidBatchError,
    LoadCheckpoint,
    LossKind,
    Mlp,
    OptimizerKind,
    SaveCheckpoint,
    Step,
    StepStats,
    Trainer,
    synthetic_classification,
)
from atomr.train.tensor_parallel.shard import ShardActor, ShardDescribe, ShardGather, ShardInfo
from atomr.train.tensor_parallel.trainer import (
    ShardGroup,
    TensorParallelConfig,
    TensorParallelTrainer,
)

CE = LossKind.CROSS_ENTROPY
# widths not divisible by 2, 3 or 4; even depth (last layer row-parallel) and
# odd depth (last layer column-parallel, output gathered)
EVEN = [6, 11, 5]
ODD = [6, 11, 9, 5]
DEEP = [5, 10, 7, 9, 4]
TOL = {"rtol": 2e-5, "atol": 2e-6}


def _devices(n: int) -> list[str]:
    return [f"cpu:{i}" for i in range(n)]


def _batch(sizes: list[int], n: int = 12, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    return synthetic_classification(n, sizes[0], sizes[-1], seed=seed)


def _reference(model: Mlp, x: np.ndarray, y: np.ndarray, loss: LossKind):
    """Output, mean loss, input gradient and flat weight gradient of the unsharded model."""
    ref = model.to("cpu:0")
    be = ref.backend
    tape = ref.forward_train(x)
    d_out = np.empty_like(tape.output)
    loss_sum, norm = loss.sums(be, tape.output, y, d_out)
    d_out /= np.float32(norm)
    dx = ref.backward(tape, d_out, input_grad=True)
    return tape.output.copy(), loss_sum / norm, dx, ref.grads.copy()


async def _group(system: ActorSystem, model: Mlp, config: TensorParallelConfig) -> ShardGroup:
    n = config.shard_count
    refs = [system.spawn(ShardActor.props(model, r, n, f"cpu:{r}")) for r in range(n)]
    return await ShardGroup.connect(refs, config)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize(
    ("sizes", "activation", "loss"),
    [(EVEN, "relu", CE), (ODD, "tanh", CE), (DEEP, "gelu", LossKind.MSE)],
)
async def test_output_and_gradients_equal_the_unsharded_model(
    actor_system: ActorSystem, n: int, sizes: list[int], activation: str, loss: LossKind
) -> None:
    model = Mlp(sizes, activation=activation, seed=7)
    x, y = _batch(sizes)
    if loss is LossKind.MSE:
        y = np.random.default_rng(1).normal(size=(12, sizes[-1])).astype(np.float32)
    config = TensorParallelConfig(n, OptimizerKind.sgd(0.1), loss=loss)
    group = await _group(actor_system, model, config)
    got = await group.gradients(x, y)
    out, value, dx, grads = _reference(model, x, y, loss)
    np.testing.assert_allclose(got.output, out, **TOL)
    assert got.loss == pytest.approx(value, rel=1e-5)
    np.testing.assert_allclose(got.input_grad, dx, **TOL)
    np.testing.assert_allclose(got.grads, grads, **TOL)
    assert got.grad_norm == pytest.approx(float(np.linalg.norm(grads)), rel=1e-5)
    assert np.count_nonzero(grads) > grads.size // 2  # a non-trivial comparison
    # phase 1 changed no weight
    np.testing.assert_array_equal(await group.gather("params"), model.get_params())


@pytest.mark.parametrize("n", [1, 2, 3, 4])
async def test_twenty_adamw_steps_equal_the_single_device_trainer(
    actor_system: ActorSystem, n: int
) -> None:
    model = Mlp(ODD, activation="tanh", seed=2)
    config = TensorParallelConfig(n, OptimizerKind.adamw(0.01, weight_decay=0.05))
    tp = await TensorParallelTrainer.spawn(actor_system, model, _devices(n), config)
    ref = await Trainer.spawn(actor_system, model, "cpu:0", config.trainer_config())
    for i in range(20):
        x, y = _batch(ODD, n=16, seed=i)
        a = await tp.ask(Step(x, y), timeout=10)
        b = await ref.ask(Step(x, y), timeout=10)
        assert isinstance(a, StepStats) and a.samples == 16 and a.applied
        assert a.loss == pytest.approx(b.loss, rel=1e-5)
        assert a.grad_norm == pytest.approx(b.grad_norm, rel=1e-4)
    wa = await tp.ask(GetWeights(), timeout=10)
    wb = await ref.ask(GetWeights(), timeout=10)
    assert not np.allclose(wb, model.get_params(), atol=1e-3)  # it trained
    np.testing.assert_allclose(wa, wb, rtol=1e-4, atol=1e-5)


async def test_clipping_uses_the_global_norm_over_all_shards(actor_system: ActorSystem) -> None:
    model = Mlp(EVEN, activation="relu", seed=4)
    opt = OptimizerKind.sgd(0.2, momentum=0.9)
    config = TensorParallelConfig(3, opt, loss=LossKind.MSE, gradient_clip=0.05)
    tp = await TensorParallelTrainer.spawn(actor_system, model, _devices(3), config)
    ref = await Trainer.spawn(actor_system, model, "cpu:0", config.trainer_config())
    rng = np.random.default_rng(0)
    for _ in range(5):
        x = rng.normal(size=(10, EVEN[0])).astype(np.float32)
        t = rng.normal(size=(10, EVEN[-1])).astype(np.float32)
        a = await tp.ask(Step(x, t), timeout=10)
        b = await ref.ask(Step(x, t), timeout=10)
        assert a.grad_norm > 0.05  # clipping is active
        assert a.grad_norm == pytest.approx(b.grad_norm, rel=1e-5)
    np.testing.assert_allclose(
        await tp.ask(GetWeights(), timeout=10), await ref.ask(GetWeights(), timeout=10), **TOL
    )


async def test_evaluate_equals_the_single_device_trainer(actor_system: ActorSystem) -> None:
    model = Mlp(DEEP, activation="relu", seed=5)
    config = TensorParallelConfig(2, OptimizerKind.sgd(0.1))
    tp = await TensorParallelTrainer.spawn(actor_system, model, _devices(2), config)
    ref = await Trainer.spawn(actor_system, model, "cpu:0", config.trainer_config())
    x, y = _batch(DEEP, n=40, seed=3)
    a = await tp.ask(Evaluate(x, y), timeout=10)
    b = await ref.ask(Evaluate(x, y), timeout=10)
    assert a.samples == b.samples == 40
    assert a.loss == pytest.approx(b.loss, rel=1e-5)
    assert a.accuracy == b.accuracy
    np.testing.assert_array_equal(await tp.ask(GetWeights()), model.get_params())


async def test_checkpoints_round_trip_with_the_single_device_trainer(
    actor_system: ActorSystem, tmp_path: Path
) -> None:
    model = Mlp(ODD, activation="tanh", seed=8)
    config = TensorParallelConfig(3, OptimizerKind.adam(0.02))
    tp = await TensorParallelTrainer.spawn(actor_system, model, _devices(3), config)
    single = await Trainer.spawn(actor_system, model, "cpu:0", config.trainer_config())
    for i in range(3):
        await tp.ask(Step(*_batch(ODD, seed=i)), timeout=10)
    await tp.ask(SaveCheckpoint(tmp_path / "tp.ckpt"), timeout=10)
    await single.ask(LoadCheckpoint(tmp_path / "tp.ckpt"), timeout=10)
    np.testing.assert_array_equal(await single.ask(GetWeights()), await tp.ask(GetWeights()))
    # the optimizer state came along: the next steps agree
    for i in range(3, 6):
        a = await tp.ask(Step(*_batch(ODD, seed=i)), timeout=10)
        b = await single.ask(Step(*_batch(ODD, seed=i)), timeout=10)
        assert a.loss == pytest.approx(b.loss, rel=1e-5)
    np.testing.assert_allclose(
        await tp.ask(GetWeights()), await single.ask(GetWeights()), rtol=1e-4, atol=1e-5
    )
    # and back: single-device -> tensor parallel on another shard count
    await single.ask(Step(*_batch(ODD, seed=9)), timeout=10)
    await single.ask(SaveCheckpoint(tmp_path / "single.ckpt"), timeout=10)
    config2 = TensorParallelConfig(2, OptimizerKind.adam(0.02))
    tp2 = await TensorParallelTrainer.spawn(actor_system, model, _devices(2), config2)
    await tp2.ask(LoadCheckpoint(tmp_path / "single.ckpt"), timeout=10)
    np.testing.assert_array_equal(await tp2.ask(GetWeights()), await single.ask(GetWeights()))
    a = await tp2.ask(Step(*_batch(ODD, seed=10)), timeout=10)
    b = await single.ask(Step(*_batch(ODD, seed=10)), timeout=10)
    assert a.loss == pytest.approx(b.loss, rel=1e-5)
    np.testing.assert_allclose(
        await tp2.ask(GetWeights()), await single.ask(GetWeights()), rtol=1e-4, atol=1e-5
    )


async def test_bad_checkpoint_changes_nothing(actor_system: ActorSystem, tmp_path: Path) -> None:
    config = TensorParallelConfig(2, OptimizerKind.sgd(0.1))
    tp = await TensorParallelTrainer.spawn(actor_system, Mlp(EVEN, seed=1), _devices(2), config)
    other = await Trainer.spawn(actor_system, Mlp([6, 12, 5]), "cpu:0", config.trainer_config())
    await other.ask(SaveCheckpoint(tmp_path / "other.ckpt"), timeout=10)
    before = await tp.ask(GetWeights())
    with pytest.raises(CheckpointError, match="checkpoint is for model"):
        await tp.ask(LoadCheckpoint(tmp_path / "other.ckpt"), timeout=10)
    (tmp_path / "junk.ckpt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError):
        await tp.ask(LoadCheckpoint(tmp_path / "junk.ckpt"), timeout=10)
    np.testing.assert_array_equal(await tp.ask(GetWeights()), before)


async def test_bad_input_is_answered_and_changes_nothing(actor_system: ActorSystem) -> None:
    model = Mlp(EVEN, seed=3)
    config = TensorParallelConfig(2, OptimizerKind.sgd(0.1))
    tp = await TensorParallelTrainer.spawn(actor_system, model, _devices(2), config)
    x, y = _batch(EVEN)
    bad = [
        (x[:, :4], y),  # wrong width
        (x, y + 10),  # label out of range
        (np.where(x > 0, np.nan, x), y),  # NaN
        (x, y[:5]),  # batch mismatch
    ]
    for features, labels in bad:
        with pytest.raises(InvalidBatchError):
            await tp.ask(Step(features, labels), timeout=10)
    np.testing.assert_array_equal(await tp.ask(GetWeights()), model.get_params())
    with pytest.raises(TypeError, match="does not handle"):
        await tp.ask("hello", timeout=10)
    stats = await tp.ask(Step(x, y), timeout=10)  # still alive and well
    assert stats.samples == 12


def _fail_once_on(monkeypatch: pytest.MonkeyPatch, method: str, rank: int) -> list[int]:
    """Make `ShardActor.<method>` raise OutOfMemory once on shard `rank`."""
    original = getattr(ShardActor, method)
    calls: list[int] = []

    def flaky(self: ShardActor, *args: object) -> object:
        if self.layout.rank != rank or calls:
            return original(self, *args)
        calls.append(rank)
        if method != "_apply":
            raise OutOfMemory("injected", str(self.device))
        # fail midway through the apply: after the optimizer has written
        opt = self.optimizer
        real_step_into = opt.step_into

        def broken(params: object, grads: object, params_out: object, spare: object) -> None:
            real_step_into(params, grads, params_out, spare)
            raise OutOfMemory("injected after the update", str(self.device))

        opt.step_into = broken
        try:
            return original(self, *args)
        finally:
            del opt.step_into

    monkeypatch.setattr(ShardActor, method, flaky)
    return calls


@pytest.mark.parametrize("method", ["_backward", "_apply"])
async def test_a_shard_failing_mid_step_leaves_no_shard_updated(
    actor_system: ActorSystem, monkeypatch: pytest.MonkeyPatch, method: str
) -> None:
    model = Mlp(ODD, activation="tanh", seed=6)
    config = TensorParallelConfig(3, OptimizerKind.adamw(0.05))
    tp = await TensorParallelTrainer.spawn(actor_system, model, _devices(3), config)
    ref = await Trainer.spawn(actor_system, model, "cpu:0", config.trainer_config())
    x0, y0 = _batch(ODD, seed=0)
    await tp.ask(Step(x0, y0), timeout=10)
    await ref.ask(Step(x0, y0), timeout=10)
    before = await tp.ask(GetWeights())
    calls = _fail_once_on(monkeypatch, method, rank=1)
    x, y = _batch(ODD, seed=1)
    with pytest.raises(OutOfMemory, match="injected") as info:
        await tp.ask(Step(x, y), timeout=10)
    assert calls == [1]
    assert getattr(info.value, "worker_index", None) == 1
    np.testing.assert_array_equal(await tp.ask(GetWeights()), before)
    # optimizer state was not advanced either: the next steps still equal the reference
    for i in (1, 2):
        xb, yb = _batch(ODD, seed=i)
        a = await tp.ask(Step(xb, yb), timeout=10)
        b = await ref.ask(Step(xb, yb), timeout=10)
        assert a.loss == pytest.approx(b.loss, rel=1e-5)
    np.testing.assert_allclose(
        await tp.ask(GetWeights()), await ref.ask(GetWeights()), rtol=1e-4, atol=1e-5
    )


async def test_width_smaller_than_shard_count_is_a_clear_error(actor_system: ActorSystem) -> None:
    config = TensorParallelConfig(4, OptimizerKind.sgd(0.1))
    with pytest.raises(ValueError, match="has 3 output features, fewer than the 4 shards"):
        await TensorParallelTrainer.spawn(actor_system, Mlp([6, 3, 5]), _devices(4), config)
    with pytest.raises(ValueError, match="layer 2 .* 2 output features"):
        await TensorParallelTrainer.spawn(actor_system, Mlp([6, 8, 8, 2]), _devices(4), config)
    with pytest.raises(ValueError, match="fewer than the 4 shards"):
        ShardActor(Mlp([6, 3, 5]), 0, 4, "cpu:0")


async def test_shard_count_must_match(actor_system: ActorSystem) -> None:
    model = Mlp(EVEN)
    config = TensorParallelConfig(2, OptimizerKind.sgd(0.1))
    with pytest.raises(ValueError, match="shard_count is 2 but 3 devices"):
        await TensorParallelTrainer.spawn(actor_system, model, _devices(3), config)
    refs = [actor_system.spawn(ShardActor.props(model, r, 3, "cpu:0")) for r in range(3)]
    with pytest.raises(ValueError, match="shard_count is 2 but 3 shards"):
        TensorParallelTrainer.props(config, refs)
    # two shards that were built for three: refused at the first request
    tp = actor_system.spawn(TensorParallelTrainer.props(config, refs[:2]))
    with pytest.raises(ValueError, match="built for 3 shards"):
        await tp.ask(GetWeights(), timeout=10)
    with pytest.raises(ValueError, match="shard_count must be an int >= 1"):
        TensorParallelConfig(0, OptimizerKind.sgd(0.1))


async def test_users_can_bring_their_own_shards(actor_system: ActorSystem) -> None:
    """The seed surface: props(config, shards) over shard refs that speak ShardProtocol."""
    model = Mlp(DEEP, activation="tanh", seed=9)
    config = TensorParallelConfig(2, OptimizerKind.sgd(0.3, momentum=0.5))
    shards = [actor_system.spawn(ShardActor.props(model, r, 2, f"cpu:{r}")) for r in range(2)]
    info = await shards[1].ask(ShardDescribe(), timeout=10)
    assert isinstance(info, ShardInfo) and info.rank == 1 and info.stages == 2
    tp = actor_system.spawn(TensorParallelTrainer.props(config, shards))
    ref = await Trainer.spawn(actor_system, model, "cpu:0", config.trainer_config())
    for i in range(4):
        x, y = _batch(DEEP, seed=i)
        await tp.ask(Step(x, y), timeout=10)
        await ref.ask(Step(x, y), timeout=10)
    np.testing.assert_allclose(await tp.ask(GetWeights()), await ref.ask(GetWeights()), **TOL)
    # each shard holds only its slice
    piece = await shards[1].ask(ShardGather("params"), timeout=10)
    assert piece.values.size == piece.index.size == info.n_params < model.n_params // 2 + 10
    with pytest.raises(TypeError, match="ShardActor does not handle str"):
        await shards[0].ask("nonsense", timeout=10)


async def test_shard_math_runs_on_the_device_threads(
    actor_system: ActorSystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: set[str] = set()
    for name in ("_forward", "_loss", "_backward", "_apply"):
        original = getattr(ShardActor, name)

        def spy(self: ShardActor, *args: object, _original=original) -> object:
            seen.add(threading.current_thread().name)
            return _original(self, *args)

        monkeypatch.setattr(ShardActor, name, spy)
    config = TensorParallelConfig(2, OptimizerKind.sgd(0.1))
    tp = await TensorParallelTrainer.spawn(actor_system, Mlp(EVEN), _devices(2), config)
    await tp.ask(Step(*_batch(EVEN)), timeout=10)
    assert threading.main_thread().name not in seen
    assert {s.split("_")[0] for s in seen} == {"atomr-cpu:0", "atomr-cpu:1"}
