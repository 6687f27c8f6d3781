"""TensorParallelTrainer: sharded output and gradients equal the unsharded
model's; training, checkpoints, atomic steps and bad input equal / match the
single-device Trainer."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from atomr import ActorSystem
from atomr.accel import OutOfMemory
from atomr.testkit import Plan, inject_faults
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
    TrainerConfig,
)
from atomr.train.core import synthetic_classification
from atomr.train.core.model import Activation, Linear, Sequential, register_layer
from atomr.train.tensor_parallel import ShardActor, TensorParallelOptions, TensorParallelTrainer
from atomr.train.tensor_parallel.group import ShardGroup
from atomr.train.tensor_parallel.messages import ShardDescribe, ShardGather, ShardInfo
from tests.reliability.faults import dying_optimizer

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


async def _group(system: ActorSystem, model: Mlp, n: int, config: TrainerConfig) -> ShardGroup:
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
    config = TrainerConfig(OptimizerKind.sgd(0.1), loss)
    group = await _group(actor_system, model, n, config)
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
    config = TrainerConfig(OptimizerKind.adamw(0.01, weight_decay=0.05), CE)
    tp = await TensorParallelTrainer.spawn(actor_system, model, _devices(n), config)
    ref = await Trainer.spawn(actor_system, model, "cpu:0", config)
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


@register_layer
class _HalvedLinear(Linear):
    """A user's subclass of the built-in Linear: its output is halved."""

    kind = "test_tp_halved_linear"

    def forward(self, backend: Any, params: Any, x: Any, ctx: Any) -> tuple[Any, Any]:
        y, saved = super().forward(backend, params, x, ctx)
        return y * y.dtype.type(0.5), saved

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
        half = dy * dy.dtype.type(0.5)
        return super().backward(backend, params, grads, saved, half, accumulate, input_grad)


async def test_a_subclass_of_a_built_in_layer_keeps_its_own_math(
    actor_system: ActorSystem,
) -> None:
    """It was split as a plain Linear, silently training another model."""
    model = Sequential([_HalvedLinear(6, 8), Activation("tanh"), Linear(8, 4)], (6,), seed=3)
    config = TrainerConfig(OptimizerKind.sgd(0.1), CE)
    tp = await TensorParallelTrainer.spawn(actor_system, model, _devices(2), config)
    ref = await Trainer.spawn(actor_system, model, "cpu:0", config)
    x, y = _batch([6, 8, 4], n=16, seed=0)
    a, b = await tp.ask(Step(x, y), timeout=10), await ref.ask(Step(x, y), timeout=10)
    assert a.loss == pytest.approx(b.loss, rel=1e-6)
    assert a.grad_norm == pytest.approx(b.grad_norm, rel=1e-5)
    wa, wb = await tp.ask(GetWeights(), timeout=10), await ref.ask(GetWeights(), timeout=10)
    np.testing.assert_allclose(wa, wb, rtol=1e-5, atol=1e-6)


async def test_clipping_uses_the_global_norm_over_all_shards(actor_system: ActorSystem) -> None:
    model = Mlp(EVEN, activation="relu", seed=4)
    opt = OptimizerKind.sgd(0.2, momentum=0.9)
    config = TrainerConfig(opt, LossKind.MSE, gradient_clip=0.05)
    tp = await TensorParallelTrainer.spawn(actor_system, model, _devices(3), config)
    ref = await Trainer.spawn(actor_system, model, "cpu:0", config)
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
    config = TrainerConfig(OptimizerKind.sgd(0.1), CE)
    tp = await TensorParallelTrainer.spawn(actor_system, model, _devices(2), config)
    ref = await Trainer.spawn(actor_system, model, "cpu:0", config)
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
    config = TrainerConfig(OptimizerKind.adam(0.02), CE)
    tp = await TensorParallelTrainer.spawn(actor_system, model, _devices(3), config)
    single = await Trainer.spawn(actor_system, model, "cpu:0", config)
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
    config2 = TrainerConfig(OptimizerKind.adam(0.02), CE)
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
    config = TrainerConfig(OptimizerKind.sgd(0.1), CE)
    tp = await TensorParallelTrainer.spawn(actor_system, Mlp(EVEN, seed=1), _devices(2), config)
    other = await Trainer.spawn(actor_system, Mlp([6, 12, 5]), "cpu:0", config)
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
    config = TrainerConfig(OptimizerKind.sgd(0.1), CE)
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


def _failing_shard(plan: Plan) -> type[ShardActor]:
    """Shard 1 fails where `plan` says: in its backward ("backward"), or
    in its apply once the optimizer has written the whole update ("apply")."""
    shard = inject_faults(ShardActor, plan, {"backward": "backward_stage"}, worker=1)
    return dying_optimizer(shard, plan, "apply", worker=1, whole=True)


@pytest.mark.parametrize("phase", ["backward", "apply"])
async def test_a_shard_failing_mid_step_leaves_no_shard_updated(
    actor_system: ActorSystem, phase: str
) -> None:
    model = Mlp(ODD, activation="tanh", seed=6)
    config = TrainerConfig(OptimizerKind.adamw(0.05), CE)
    plan = Plan()
    options = TensorParallelOptions(shard_class=_failing_shard(plan))
    tp = await TensorParallelTrainer.spawn(actor_system, model, _devices(3), config, options)
    ref = await Trainer.spawn(actor_system, model, "cpu:0", config)
    x0, y0 = _batch(ODD, seed=0)
    await tp.ask(Step(x0, y0), timeout=10)
    await ref.ask(Step(x0, y0), timeout=10)
    before = await tp.ask(GetWeights())
    plan.arm(phase, OutOfMemory)
    x, y = _batch(ODD, seed=1)
    with pytest.raises(OutOfMemory, match="injected") as info:
        await tp.ask(Step(x, y), timeout=10)
    assert plan.fired == [phase]
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
    config = TrainerConfig(OptimizerKind.sgd(0.1), CE)
    with pytest.raises(ValueError, match="has 3 output features, fewer than the 4 shards"):
        await TensorParallelTrainer.spawn(actor_system, Mlp([6, 3, 5]), _devices(4), config)
    with pytest.raises(ValueError, match="layer 2 .* 2 output features"):
        await TensorParallelTrainer.spawn(actor_system, Mlp([6, 8, 8, 2]), _devices(4), config)
    with pytest.raises(ValueError, match="fewer than the 4 shards"):
        ShardActor(Mlp([6, 3, 5]), 0, 4, "cpu:0")


async def test_the_shards_must_agree_with_their_number_and_order(
    actor_system: ActorSystem,
) -> None:
    model = Mlp(EVEN)
    config = TrainerConfig(OptimizerKind.sgd(0.1), CE)
    refs = [actor_system.spawn(ShardActor.props(model, r, 3, "cpu:0")) for r in range(3)]
    # two shards that were built for three: refused at the first request
    tp = actor_system.spawn(TensorParallelTrainer.props(config, refs[:2]))
    with pytest.raises(ValueError, match="shard 0 was built for 3 shards; 2 were given"):
        await tp.ask(GetWeights(), timeout=10)
    # all three, out of rank order
    swapped = actor_system.spawn(TensorParallelTrainer.props(config, [refs[1], refs[0], refs[2]]))
    with pytest.raises(ValueError, match="position 0 says it has rank 1"):
        await swapped.ask(GetWeights(), timeout=10)


async def test_shards_of_another_dtype_are_refused(actor_system: ActorSystem) -> None:
    # one model computes in one dtype: shard 1's float64 slice would be
    # rounded into shard 0's float32 weights by GetWeights and checkpoints
    config = TrainerConfig(OptimizerKind.sgd(0.1), CE)
    models = [Mlp(EVEN), Mlp(EVEN, dtype=np.float64)]
    refs = [actor_system.spawn(ShardActor.props(models[r], r, 2, "cpu:0")) for r in range(2)]
    tp = actor_system.spawn(TensorParallelTrainer.props(config, refs))
    with pytest.raises(ValueError, match="shard 1 computes in float64, shard 0 in float32"):
        await tp.ask(GetWeights(), timeout=10)


async def test_spawn_refuses_bad_arguments_before_spawning(actor_system: ActorSystem) -> None:
    model, devices = Mlp(EVEN), _devices(2)
    config = TrainerConfig(OptimizerKind.sgd(0.1), CE)
    before = list(actor_system.actors)
    spawn = TensorParallelTrainer.spawn
    cases: list[tuple[type[Exception], str, dict[str, object]]] = [
        (TypeError, "model must be a Sequential", {"model": EVEN}),
        (TypeError, "devices must be a sequence", {"devices": "cpu:0"}),
        (TypeError, r"devices\[0\] must be a Device", {"devices": [0, 1]}),
        (ValueError, "devices is empty", {"devices": []}),
        (ValueError, "unknown device 'gpu:0'", {"devices": ["cpu:0", "gpu:0"]}),
        (TypeError, "config must be a TrainerConfig", {"config": OptimizerKind.sgd(0.1)}),
        (TypeError, "options must be a TensorParallelOptions", {"options": config}),
        (TypeError, "name must be a str", {"name": 7}),
        (
            ValueError,
            "accumulation_steps is 2",
            {"config": TrainerConfig(config.optimizer, CE, accumulation_steps=2)},
        ),
        (ValueError, "activate_last", {"model": Mlp(EVEN, activate_last=True)}),
        (ValueError, "fewer than the 4 shards", {"model": Mlp([6, 3, 5]), "devices": _devices(4)}),
    ]
    for error, match, change in cases:
        args: dict[str, object] = {"model": model, "devices": devices, "config": config}
        with pytest.raises(error, match=match):
            await spawn(actor_system, **{**args, **change})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="system must be an ActorSystem or a Context"):
        await spawn("system", model, devices, config)  # type: ignore[arg-type]
    assert actor_system.actors == before


async def test_props_refuses_bad_arguments_before_spawning(actor_system: ActorSystem) -> None:
    config = TrainerConfig(OptimizerKind.sgd(0.1), CE)
    shards = [ShardActor.props(Mlp(EVEN), r, 2, "cpu:0") for r in range(2)]
    ref = actor_system.spawn(shards[0])
    before = list(actor_system.actors)
    props = TensorParallelTrainer.props
    with pytest.raises(TypeError, match="config must be a TrainerConfig"):
        props(TensorParallelOptions(), shards)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="shards must be a sequence"):
        props(config, shards[0])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="all be ActorRefs or all be Props"):
        props(config, [ref, shards[1]])
    with pytest.raises(ValueError, match="shards is empty"):
        props(config, [])
    with pytest.raises(ValueError, match=r"shards\[1\] is shards\[0\] again"):
        props(config, [ref, ref])  # one actor cannot be two shards
    with pytest.raises(TypeError, match="options must be a TensorParallelOptions"):
        props(config, shards, config)  # type: ignore[arg-type]
    accumulating = TrainerConfig(config.optimizer, CE, accumulation_steps=3)
    with pytest.raises(ValueError, match="does not accumulate"):
        props(accumulating, shards)
    with pytest.raises(ValueError, match="shard_class"):
        props(config, shards, TensorParallelOptions(shard_class=CountingShard))
    assert actor_system.actors == before


class CountingShard(ShardActor):
    """A shard that counts the steps it applied (a user's instrumented shard)."""

    applied: ClassVar[list[int]] = []

    def apply_gradients(self, scale: float) -> None:
        super().apply_gradients(scale)
        CountingShard.applied.append(self.worker_index)


async def test_spawn_builds_the_shard_class_of_its_options(actor_system: ActorSystem) -> None:
    model = Mlp(ODD, activation="tanh", seed=3)
    config = TrainerConfig(OptimizerKind.adam(0.01), CE)
    options = TensorParallelOptions(shard_class=CountingShard)
    CountingShard.applied = []
    tp = await TensorParallelTrainer.spawn(actor_system, model, _devices(3), config, options)
    ref = await Trainer.spawn(actor_system, model, "cpu:0", config)
    for i in range(2):
        await tp.ask(Step(*_batch(ODD, seed=i)), timeout=10)
        await ref.ask(Step(*_batch(ODD, seed=i)), timeout=10)
    assert sorted(CountingShard.applied) == [0, 0, 1, 1, 2, 2]
    np.testing.assert_allclose(await tp.ask(GetWeights()), await ref.ask(GetWeights()), **TOL)


async def test_users_can_bring_their_own_shards(actor_system: ActorSystem) -> None:
    """The seed surface: props(config, shards) over shard refs that speak ShardProtocol."""
    model = Mlp(DEEP, activation="tanh", seed=9)
    config = TrainerConfig(OptimizerKind.sgd(0.3, momentum=0.5), CE)
    shards = [actor_system.spawn(ShardActor.props(model, r, 2, f"cpu:{r}")) for r in range(2)]
    info = await shards[1].ask(ShardDescribe(), timeout=10)
    assert isinstance(info, ShardInfo) and info.rank == 1 and info.stages == 2
    tp = actor_system.spawn(TensorParallelTrainer.props(config, shards))
    ref = await Trainer.spawn(actor_system, model, "cpu:0", config)
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


class ThreadSpyShard(ShardActor):
    """Notes the thread each of its math hooks runs on."""

    seen: ClassVar[set[str]] = set()

    def forward_stage(self, *args: Any) -> Any:
        self.seen.add(threading.current_thread().name)
        return super().forward_stage(*args)

    def compute_loss(self, *args: Any) -> Any:
        self.seen.add(threading.current_thread().name)
        return super().compute_loss(*args)

    def backward_stage(self, *args: Any) -> Any:
        self.seen.add(threading.current_thread().name)
        return super().backward_stage(*args)

    def apply_gradients(self, scale: float) -> None:
        self.seen.add(threading.current_thread().name)
        super().apply_gradients(scale)


async def test_shard_math_runs_on_the_device_threads(actor_system: ActorSystem) -> None:
    seen = ThreadSpyShard.seen = set()
    config = TrainerConfig(OptimizerKind.sgd(0.1), CE)
    options = TensorParallelOptions(shard_class=ThreadSpyShard)
    tp = await TensorParallelTrainer.spawn(actor_system, Mlp(EVEN), _devices(2), config, options)
    await tp.ask(Step(*_batch(EVEN)), timeout=10)
    assert threading.main_thread().name not in seen
    assert {s.split("_")[0] for s in seen} == {"atomr-cpu:0", "atomr-cpu:1"}
