"""PipelineParallelTrainer: equal to the single-device Trainer on the whole
batch for both schedules, p in {1..4} stages and m in {1, 2, 4, 8} uneven
micro-batches; activations held per stage; atomic steps (a stage failing in
a forward, a backward or an apply changes no stage); bad input; evaluation
and checkpoints interchangeable with the Trainer."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from atomr.accel import OutOfMemory, cpu_devices
from atomr.actor import Props
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
    Trainer,
    TrainerConfig,
)
from atomr.train.core import synthetic_classification
from atomr.train.core.model import Activation, Linear, Sequential
from atomr.train.core.model.transformer import Embedding
from atomr.train.pipeline import (
    GetGradients,
    GetTimeline,
    PipelineOptions,
    PipelineParallelTrainer,
    Schedule,
    StageActor,
    Timeline,
)

SIZES = [6, 5, 5, 5, 5, 3]
BATCH = 15
# micro-batch size giving m micro-batches of a batch of 15 (uneven for m > 1)
MBS = {1: 15, 2: 8, 4: 4, 8: 2}
WCE = LossKind.weighted_cross_entropy([1.0, 2.0, 0.5])
T = 20.0


def _batches(n_steps: int = 10, loss: LossKind = WCE) -> list[tuple[np.ndarray, np.ndarray]]:
    out = []
    for i in range(n_steps):
        x, y = synthetic_classification(BATCH, SIZES[0], SIZES[-1], seed=100 + i)
        if not loss.is_classification:
            y = np.random.default_rng(i).normal(size=(BATCH, SIZES[-1])).astype(np.float32)
        out.append((x, y))
    return out


def _whole_batch_gradient(sizes, params, x, y, loss: LossKind, activation: str) -> np.ndarray:
    """The gradient of the whole-batch mean loss, computed by one unsplit Mlp."""
    model = Mlp.from_params(sizes, params, activation)
    tape = model.forward_train(x)
    _, d_out = loss.compute(tape.output, y)
    model.backward(tape, np.ascontiguousarray(d_out, dtype=np.float32))
    return np.array(model.grads)


async def _reference(system, model, batches, opt, loss, clip):
    ref = await Trainer.spawn(system, model, "cpu:0", TrainerConfig(opt, loss, gradient_clip=clip))
    stats = [await ref.ask(Step(x, y), timeout=T) for x, y in batches]
    return stats, await ref.ask(GetWeights(), timeout=T)


@pytest.mark.parametrize("m", [1, 2, 4, 8])
@pytest.mark.parametrize("p", [1, 2, 3, 4])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
async def test_equals_single_device_trainer(actor_system, schedule, p, m) -> None:
    model = Mlp(SIZES, activation="tanh", seed=3)
    opt, clip = OptimizerKind.adam(0.05), 0.3
    batches = _batches()
    ref_stats, ref_weights = await _reference(actor_system, model, batches, opt, WCE, clip)
    config = TrainerConfig(opt, WCE, gradient_clip=clip)
    options = PipelineOptions(MBS[m], schedule)
    pipe = await PipelineParallelTrainer.spawn(actor_system, model, cpu_devices(p), config, options)
    clipped = 0
    for (x, y), expected in zip(batches, ref_stats, strict=True):
        before = await pipe.ask(GetWeights(), timeout=T)
        stats = await pipe.ask(Step(x, y), timeout=T)
        assert stats.samples == BATCH and stats.applied
        assert stats.loss == pytest.approx(expected.loss, rel=1e-5)
        assert stats.grad_norm == pytest.approx(expected.grad_norm, rel=1e-5)
        g = _whole_batch_gradient(SIZES, before, x, y, WCE, "tanh")
        coef = min(1.0, clip / (np.linalg.norm(g) + 1e-6))
        clipped += coef < 1.0
        np.testing.assert_allclose(
            await pipe.ask(GetGradients(), timeout=T), g * coef, rtol=1e-4, atol=1e-6
        )
    assert clipped > 0  # clipping by the global norm was exercised
    np.testing.assert_allclose(await pipe.ask(GetWeights(), timeout=T), ref_weights, atol=2e-5)

    timeline = await pipe.ask(GetTimeline(), timeout=T)
    assert isinstance(timeline, Timeline)
    assert (timeline.n_stages, timeline.n_micro, timeline.schedule) == (p, m, schedule)
    assert len(timeline.intervals) == 2 * m * p
    assert all(0.0 <= iv.start <= iv.end <= timeline.step_seconds for iv in timeline.intervals)
    assert 0.0 <= timeline.bubble_fraction < 1.0
    for s in range(p):
        # F of micro-batch k on stage s ends before F of k starts on stage s + 1
        fwd = {(iv.stage, iv.micro): iv for iv in timeline.intervals if iv.kind == "F"}
        if s + 1 < p:
            assert all(fwd[s, k].end <= fwd[s + 1, k].start for k in range(m))
    if schedule == "1f1b":
        assert all(h <= p for h in timeline.peak_held)
        assert list(timeline.peak_held) == [min(p - s, m) for s in range(p)]
    else:
        assert list(timeline.peak_held) == [m] * p


@pytest.mark.parametrize("loss", [LossKind.MSE, LossKind.CROSS_ENTROPY])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
async def test_other_losses_and_sgd(actor_system, loss, schedule) -> None:
    model = Mlp(SIZES, activation="relu", seed=5)
    opt = OptimizerKind.sgd(0.1, momentum=0.9, nesterov=True)
    batches = _batches(5, loss)
    ref_stats, ref_weights = await _reference(actor_system, model, batches, opt, loss, None)
    pipe = await PipelineParallelTrainer.spawn(
        actor_system, model, cpu_devices(3), TrainerConfig(opt, loss), PipelineOptions(4, schedule)
    )
    for (x, y), expected in zip(batches, ref_stats, strict=True):
        stats = await pipe.ask(Step(x, y), timeout=T)
        assert stats.loss == pytest.approx(expected.loss, rel=1e-5)
    np.testing.assert_allclose(await pipe.ask(GetWeights(), timeout=T), ref_weights, atol=2e-5)


async def test_mse_over_outputs_of_several_axes_equals_trainer(actor_system) -> None:
    """A (batch, 3, 2) regression: the normaliser counts every target value
    (it counted rows x last axis: loss and gradient 3x too big)."""

    def model() -> Sequential:
        return Sequential([Linear(4, 6), Activation("tanh"), Linear(6, 2)], (3, 4), seed=0)

    config = TrainerConfig(OptimizerKind.sgd(0.1), LossKind.MSE)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 3, 4)).astype(np.float32)
    y = rng.standard_normal((8, 3, 2)).astype(np.float32)
    single = await Trainer.spawn(actor_system, model(), "cpu:0", config)
    pipe = await PipelineParallelTrainer.spawn(
        actor_system, model(), cpu_devices(2), config, PipelineOptions(micro_batch_size=4)
    )
    a, b = await single.ask(Step(x, y), timeout=T), await pipe.ask(Step(x, y), timeout=T)
    assert b.loss == pytest.approx(a.loss, rel=1e-6)
    assert b.grad_norm == pytest.approx(a.grad_norm, rel=1e-5)
    np.testing.assert_allclose(
        await pipe.ask(GetWeights(), timeout=T),
        await single.ask(GetWeights(), timeout=T),
        atol=1e-6,
    )
    evaluated = await pipe.ask(Evaluate(x, y), timeout=T)
    assert evaluated.loss == pytest.approx(
        (await single.ask(Evaluate(x, y), timeout=T)).loss, rel=1e-6
    )


class FaultyStage(StageActor):
    """A stage that fails on step 1: in a forward or backward of one
    micro-batch, or in its optimizer apply after changing its weights."""

    def __init__(self, model, device, where: str, micro: int = 0) -> None:
        super().__init__(model, device)
        self.where, self.micro, self.step = where, micro, 0

    def forward_micro(self, micro, x, target, normaliser, train):
        if train and micro == 0:
            self.step += 1
        if self.where == "F" and self.step == 1 and micro == self.micro:
            raise OutOfMemory("injected forward failure", str(self.device))
        return super().forward_micro(micro, x, target, normaliser, train)

    def backward_micro(self, micro, dy, accumulate):
        if self.where == "B" and self.step == 1 and micro == self.micro:
            raise OutOfMemory("injected backward failure", str(self.device))
        return super().backward_micro(micro, dy, accumulate)

    def apply_gradients(self, step_id, coef):
        super().apply_gradients(step_id, coef)  # weights changed, then it fails
        if self.where == "apply" and self.step == 1:
            raise OutOfMemory("injected apply failure", str(self.device))


def _user_stages(system, model, faulty: int, where: str, micro: int):
    """Three user-spawned stages (layers 2-2-1), stage `faulty` a FaultyStage."""
    cuts = [(0, 2), (2, 4), (4, 5)]
    refs = []
    for s, ((a, b), dev) in enumerate(zip(cuts, cpu_devices(3), strict=True)):
        sub = model.slice_layers(a, b)
        props = (
            Props(FaultyStage, sub, dev, where, micro)
            if s == faulty
            else StageActor.props(sub, dev)
        )
        refs.append(system.spawn(props))
    return refs


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(
    ("faulty", "where", "micro"),
    [
        (0, "F", 2),
        (1, "F", 3),
        (2, "F", 1),
        (1, "B", 0),
        (0, "B", 3),
        (1, "apply", 0),
        (2, "apply", 0),
    ],
)
async def test_a_failing_stage_changes_no_stage(
    actor_system, schedule, faulty, where, micro
) -> None:
    model = Mlp(SIZES, seed=7)
    opt = OptimizerKind.adam(0.05)
    batches = _batches(2, LossKind.CROSS_ENTROPY)
    stages = _user_stages(actor_system, model, faulty, where, micro)
    config = TrainerConfig(opt, LossKind.CROSS_ENTROPY)
    options = PipelineOptions(4, schedule)
    pipe = actor_system.spawn(PipelineParallelTrainer.props(config, stages, options))
    before = await pipe.ask(GetWeights(), timeout=T)
    with pytest.raises(
        OutOfMemory,
        match=f"injected {'forward' if where == 'F' else 'backward' if where == 'B' else 'apply'}",
    ):
        await pipe.ask(Step(*batches[0]), timeout=T)
    np.testing.assert_array_equal(await pipe.ask(GetWeights(), timeout=T), before)
    # the trainer and every stage carry on: the next step equals one Trainer step
    stats = await pipe.ask(Step(*batches[1]), timeout=T)
    ref_stats, ref_weights = await _reference(
        actor_system, model, batches[1:], opt, LossKind.CROSS_ENTROPY, None
    )
    assert stats.loss == pytest.approx(ref_stats[0].loss, rel=1e-5)
    np.testing.assert_allclose(await pipe.ask(GetWeights(), timeout=T), ref_weights, atol=2e-5)


async def test_more_stages_than_layers_is_a_clear_error(actor_system) -> None:
    model = Mlp(SIZES)
    config = TrainerConfig(OptimizerKind.sgd(0.1), LossKind.CROSS_ENTROPY)
    with pytest.raises(ValueError, match="6 stages for a model of 5 layers"):
        await PipelineParallelTrainer.spawn(actor_system, model, cpu_devices(6), config)
    with pytest.raises(ValueError, match="split"):
        await PipelineParallelTrainer.spawn(
            actor_system, model, cpu_devices(2), config, PipelineOptions(split=[4, 2])
        )
    with pytest.raises(ValueError, match="at least one device"):
        await PipelineParallelTrainer.spawn(actor_system, model, [], config)
    with pytest.raises(ValueError, match="micro_batch_size"):
        PipelineOptions(0)


class RecordingStage(StageActor):
    """A stage that records the layer widths it was given."""

    built: list[tuple[int, ...]] = []

    def __init__(self, model: Mlp, device: str) -> None:
        super().__init__(model, device)
        RecordingStage.built.append(tuple(model.sizes))


async def test_explicit_and_balanced_split(actor_system) -> None:
    model = Mlp([6, 40, 5, 5, 3], seed=2)  # layer 0 dominates the parameter count
    config = TrainerConfig(OptimizerKind.sgd(0.1), LossKind.CROSS_ENTROPY)
    x, y = synthetic_classification(BATCH, 6, 3, seed=0)
    picked = {}
    for split in (None, [1, 3], [3, 1]):
        RecordingStage.built = []
        options = PipelineOptions(4, split=split, stage_class=RecordingStage)
        pipe = await PipelineParallelTrainer.spawn(
            actor_system, model, cpu_devices(2), config, options
        )
        np.testing.assert_array_equal(await pipe.ask(GetWeights(), timeout=T), model.get_params())
        await pipe.ask(Step(x, y), timeout=T)
        picked[None if split is None else tuple(split)] = RecordingStage.built
    assert picked[(1, 3)] == [(6, 40), (40, 5, 5, 3)]
    assert picked[(3, 1)] == [(6, 40, 5, 5), (5, 3)]
    assert picked[None] == picked[(1, 3)]  # the balanced split: layer 0 alone


async def test_bad_input_is_answered_and_changes_nothing(actor_system) -> None:
    model = Mlp(SIZES, seed=1)
    config = TrainerConfig(OptimizerKind.sgd(0.1), WCE)
    options = PipelineOptions(4)
    pipe = await PipelineParallelTrainer.spawn(actor_system, model, cpu_devices(2), config, options)
    x, y = synthetic_classification(BATCH, 6, 3, seed=0)
    before = await pipe.ask(GetWeights(), timeout=T)
    with pytest.raises(InvalidBatchError, match="width"):
        await pipe.ask(Step(x[:, :4], y), timeout=T)
    with pytest.raises(InvalidBatchError, match="labels"):
        await pipe.ask(Step(x, y + 5), timeout=T)
    bad = x.copy()
    bad[3, 1] = np.nan
    with pytest.raises(InvalidBatchError, match="NaN"):
        await pipe.ask(Step(bad, y), timeout=T)
    zero_weight = LossKind.weighted_cross_entropy([0.0, 1.0, 1.0])
    pipe2 = await PipelineParallelTrainer.spawn(
        actor_system,
        model,
        cpu_devices(2),
        TrainerConfig(OptimizerKind.sgd(0.1), zero_weight),
        options,
    )
    with pytest.raises(InvalidBatchError, match="class weight 0"):
        await pipe2.ask(Step(x, np.zeros(BATCH, dtype=np.int64)), timeout=T)
    with pytest.raises(TypeError, match="does not handle"):
        await pipe.ask("hello", timeout=T)
    np.testing.assert_array_equal(await pipe.ask(GetWeights(), timeout=T), before)
    assert (await pipe.ask(Step(x, y), timeout=T)).applied


async def test_evaluate_equals_trainer(actor_system) -> None:
    model = Mlp(SIZES, seed=4)
    loss = LossKind.CROSS_ENTROPY
    x, y = synthetic_classification(BATCH, 6, 3, seed=9)
    ref = await Trainer.spawn(
        actor_system, model, "cpu:0", TrainerConfig(OptimizerKind.sgd(0.1), loss)
    )
    pipe = await PipelineParallelTrainer.spawn(
        actor_system,
        model,
        cpu_devices(3),
        TrainerConfig(OptimizerKind.sgd(0.1), loss),
        PipelineOptions(4),
    )
    mine, theirs = (
        await pipe.ask(Evaluate(x, y), timeout=T),
        await ref.ask(Evaluate(x, y), timeout=T),
    )
    assert mine.loss == pytest.approx(theirs.loss, rel=1e-6)
    assert mine.accuracy == theirs.accuracy and mine.samples == BATCH
    np.testing.assert_array_equal(await pipe.ask(GetWeights(), timeout=T), model.get_params())


async def test_checkpoints_are_interchangeable_with_the_trainer(actor_system, tmp_path) -> None:
    model = Mlp(SIZES, seed=6)
    loss, opt = LossKind.CROSS_ENTROPY, OptimizerKind.adamw(0.02)
    batches = _batches(4, loss)
    pipe = await PipelineParallelTrainer.spawn(
        actor_system, model, cpu_devices(3), TrainerConfig(opt, loss), PipelineOptions(4, "gpipe")
    )
    single = await Trainer.spawn(actor_system, model, "cpu:0", TrainerConfig(opt, loss))
    for x, y in batches[:2]:
        await pipe.ask(Step(x, y), timeout=T)
    await pipe.ask(SaveCheckpoint(tmp_path / "pipe.ckpt"), timeout=T)
    await single.ask(LoadCheckpoint(tmp_path / "pipe.ckpt"), timeout=T)
    for x, y in batches[2:]:  # optimizer state carried over: the runs stay equal
        a = await pipe.ask(Step(x, y), timeout=T)
        b = await single.ask(Step(x, y), timeout=T)
        assert a.loss == pytest.approx(b.loss, rel=1e-5)
    w_single = await single.ask(GetWeights(), timeout=T)
    np.testing.assert_allclose(await pipe.ask(GetWeights(), timeout=T), w_single, atol=2e-5)
    # and back: a Trainer checkpoint loads into a fresh pipeline of another split
    await single.ask(SaveCheckpoint(tmp_path / "single.ckpt"), timeout=T)
    other = await PipelineParallelTrainer.spawn(
        actor_system, model, cpu_devices(2), TrainerConfig(opt, loss), PipelineOptions(2)
    )
    await other.ask(LoadCheckpoint(tmp_path / "single.ckpt"), timeout=T)
    np.testing.assert_array_equal(await other.ask(GetWeights(), timeout=T), w_single)
    # a checkpoint of another model is refused and changes nothing
    small = await Trainer.spawn(actor_system, Mlp([6, 3]), "cpu:0", TrainerConfig(opt, loss))
    await small.ask(SaveCheckpoint(tmp_path / "small.ckpt"), timeout=T)
    from atomr.train import CheckpointError

    with pytest.raises(CheckpointError):
        await other.ask(LoadCheckpoint(tmp_path / "small.ckpt"), timeout=T)
    np.testing.assert_array_equal(await other.ask(GetWeights(), timeout=T), w_single)


async def test_a_checkpoint_keeps_the_models_activate_last(actor_system, tmp_path) -> None:
    """The merged config said activate_last False for any Mlp: a pipeline
    checkpoint of an Mlp activating its output loaded into one that does not."""
    model = Mlp(SIZES, activation="tanh", seed=2, activate_last=True)
    config = TrainerConfig(OptimizerKind.sgd(0.1), LossKind.MSE)
    pipe = await PipelineParallelTrainer.spawn(
        actor_system, model, cpu_devices(3), config, PipelineOptions(4)
    )
    x, y = _batches(1, LossKind.MSE)[0]
    await pipe.ask(Step(x, y), timeout=T)
    await pipe.ask(SaveCheckpoint(tmp_path / "pipe.ckpt"), timeout=T)
    weights = await pipe.ask(GetWeights(), timeout=T)
    same = await Trainer.spawn(actor_system, model, "cpu:0", config)
    await same.ask(LoadCheckpoint(tmp_path / "pipe.ckpt"), timeout=T)
    np.testing.assert_array_equal(await same.ask(GetWeights(), timeout=T), weights)
    mine = await same.ask(Evaluate(x, y), timeout=T)
    theirs = await pipe.ask(Evaluate(x, y), timeout=T)
    assert mine.loss == pytest.approx(theirs.loss, rel=1e-6)
    await pipe.ask(LoadCheckpoint(tmp_path / "pipe.ckpt"), timeout=T)  # and back into itself
    plain = Mlp(SIZES, activation="tanh", seed=3)
    other = await Trainer.spawn(actor_system, plain, "cpu:0", config)
    with pytest.raises(
        CheckpointError, match="activate_last=True, this model has activate_last=False"
    ):
        await other.ask(LoadCheckpoint(tmp_path / "pipe.ckpt"), timeout=T)
    np.testing.assert_array_equal(await other.ask(GetWeights(), timeout=T), plain.get_params())


class ThreadSpyStage(StageActor):
    """Notes the thread its forward hook runs on."""

    seen: set[str] = set()

    def forward_micro(self, *args):
        self.seen.add(threading.current_thread().name)
        return super().forward_micro(*args)


async def test_stage_math_runs_on_device_threads(actor_system) -> None:
    seen = ThreadSpyStage.seen = set()
    model = Mlp(SIZES)
    pipe = await PipelineParallelTrainer.spawn(
        actor_system,
        model,
        cpu_devices(2),
        TrainerConfig(OptimizerKind.sgd(0.1), LossKind.CROSS_ENTROPY),
        PipelineOptions(4, Schedule.GPIPE, stage_class=ThreadSpyStage),
    )
    await pipe.ask(Step(*synthetic_classification(BATCH, 6, 3, seed=0)), timeout=T)
    assert threading.main_thread().name not in seen
    assert len(seen) == 2 and all("cpu" in name for name in seen)


async def test_spawn_refuses_bad_arguments_before_spawning(actor_system) -> None:
    model = Mlp(SIZES)
    config = TrainerConfig(OptimizerKind.sgd(0.1), LossKind.CROSS_ENTROPY)
    before = list(actor_system.actors)
    cases = [
        (TypeError, "model must be a Sequential", {"model": SIZES}),
        (TypeError, "devices must be a sequence", {"devices": "cpu:0"}),
        (TypeError, r"devices\[0\] must be a Device", {"devices": [None]}),
        (ValueError, "unknown device 'tpu'", {"devices": ["cpu:0", "tpu"]}),
        (TypeError, "config must be a TrainerConfig", {"config": PipelineOptions()}),
        (TypeError, "options must be a PipelineOptions", {"options": config}),
        (TypeError, "name must be a str", {"name": b"pipe"}),
        (
            ValueError,
            "pipeline trainer does not accumulate gradients across Steps",
            {"config": TrainerConfig(config.optimizer, config.loss, accumulation_steps=4)},
        ),
        (ValueError, r"split \[2, 2\] must .* cover", {"options": PipelineOptions(split=[2, 2])}),
    ]
    for error, match, change in cases:
        args = {"model": model, "devices": cpu_devices(2), "config": config, **change}
        with pytest.raises(error, match=match):
            await PipelineParallelTrainer.spawn(actor_system, **args)
    with pytest.raises(TypeError, match="system must be an ActorSystem or a Context"):
        await PipelineParallelTrainer.spawn(None, model, cpu_devices(2), config)
    assert actor_system.actors == before


async def test_stages_without_parameters_are_never_made(actor_system) -> None:
    """Activations between the linear layers cost time but hold nothing: the
    default split puts one beside a layer that has, more devices than such
    layers are refused up front, and so is a split with an empty stage."""
    model = Sequential(
        [Linear(6, 8), Activation("tanh"), Activation("relu"), Linear(8, 3)], (6,), seed=1
    )
    config = TrainerConfig(OptimizerKind.sgd(0.1), WCE)
    x, y = synthetic_classification(BATCH, 6, 3, seed=1)
    single = await Trainer.spawn(actor_system, model, "cpu:0", config)
    await single.ask(Step(x, y), timeout=T)
    for options in (
        PipelineOptions(),
        PipelineOptions(split=[1, 3]),
        PipelineOptions(split=[3, 1]),
    ):
        pipe = await PipelineParallelTrainer.spawn(
            actor_system, model, cpu_devices(2), config, options
        )
        await pipe.ask(Step(x, y), timeout=T)
        np.testing.assert_allclose(
            await pipe.ask(GetWeights(), timeout=T), await single.ask(GetWeights()), rtol=1e-6
        )
    before = actor_system.actors
    with pytest.raises(ValueError, match="every stage needs a layer with parameters"):
        await PipelineParallelTrainer.spawn(actor_system, model, cpu_devices(3), config)
    with pytest.raises(ValueError, match=r"stage 1 \(layers 1..2\) has no parameters"):
        options = PipelineOptions(split=[1, 2, 1])
        await PipelineParallelTrainer.spawn(actor_system, model, cpu_devices(3), config, options)
    assert actor_system.actors == before


async def test_props_refuses_bad_arguments_before_spawning(actor_system) -> None:
    model = Mlp(SIZES)
    config = TrainerConfig(OptimizerKind.sgd(0.1), LossKind.CROSS_ENTROPY)
    stages = [
        StageActor.props(model.slice_layers(0, 2), "cpu:0"),
        StageActor.props(model.slice_layers(2, 5), "cpu:1"),
    ]
    ref = actor_system.spawn(stages[0])
    before = list(actor_system.actors)
    props = PipelineParallelTrainer.props
    with pytest.raises(TypeError, match="config must be a TrainerConfig"):
        props(PipelineOptions(), stages)
    with pytest.raises(TypeError, match="stages must be a sequence"):
        props(config, stages[0])
    with pytest.raises(TypeError, match="all be ActorRefs or all be Props"):
        props(config, [ref, stages[1]])
    with pytest.raises(ValueError, match="stages is empty"):
        props(config, [])
    with pytest.raises(ValueError, match=r"stages\[1\] is stages\[0\] again"):
        props(config, [ref, ref])  # one actor cannot be two stages
    with pytest.raises(TypeError, match="options must be a PipelineOptions"):
        props(config, stages, config)
    with pytest.raises(ValueError, match="does not accumulate"):
        props(TrainerConfig(config.optimizer, config.loss, accumulation_steps=2), stages)
    with pytest.raises(ValueError, match="options.split and options.stage_class"):
        props(config, stages, PipelineOptions(split=[2, 3]))
    with pytest.raises(ValueError, match="options.split and options.stage_class"):
        props(config, stages, PipelineOptions(stage_class=RecordingStage))
    assert actor_system.actors == before


def _not_one_model(case: str) -> list[Props]:
    """Two stages for props that are no cut of one model (the case named)."""
    relu = Mlp([6, 5, 3], seed=1)
    second = relu.slice_layers(1, 2)
    if case == "dtype":
        second = Mlp([6, 5, 3], seed=1, dtype=np.float64).slice_layers(1, 2)
    if case == "activation":
        second = Mlp([6, 5, 3], activation="tanh", seed=1).slice_layers(1, 2)
    if case == "sequential":
        second = Sequential([Linear(5, 3)], [5])
    if case == "tokens":  # token ids in, behind a stage that gives floats
        embed = Embedding(vocab=3, d_model=4, context=5)
        second = Sequential([embed, Linear(4, 3)], [5], input_kind="tokens")
    first = Mlp([6, 5], seed=1) if case == "no activation" else relu.slice_layers(0, 1)
    if case == "tokens":
        first = Sequential([Linear(6, 5)], [6])
    return [StageActor.props(first, "cpu:0"), StageActor.props(second, "cpu:1")]


@pytest.mark.parametrize(
    ("case", "match"),
    [
        ("dtype", "stage 1 computes in float64, stage 0 in float32"),
        ("activation", "stage 1 applies 'tanh', stage 0 'relu'"),
        ("no activation", "stage 0 does not end in its activation"),
        ("sequential", "stage 1 is not an Mlp slice and stage 0 is"),
        ("tokens", "stage 1 takes token ids, but only stage 0 takes the batch"),
    ],
)
async def test_stages_that_are_no_cut_of_one_model_are_refused_at_the_first_request(
    actor_system, case: str, match: str
) -> None:
    # such stages train a model other than the one their checkpoint would name
    # (an Mlp of stage 0's activation and dtype, activation after every inner
    # stage), and that checkpoint loaded silently into that other model
    config = TrainerConfig(OptimizerKind.sgd(0.1), LossKind.CROSS_ENTROPY)
    pipe = actor_system.spawn(PipelineParallelTrainer.props(config, _not_one_model(case)))
    x, y = synthetic_classification(4, 6, 3, seed=0)
    if case == "tokens":  # the token stage outputs a (5, 3) sequence per sample
        y = np.zeros((4, 5), dtype=np.int64)
    with pytest.raises(ValueError, match=match):
        await pipe.ask(Step(x, y), timeout=T)


async def test_the_normaliser_rounds_class_weights_as_the_kernels_do(actor_system) -> None:
    # 0.2 is 0.20000000298 in float32, the weight the single-device kernel sums:
    # the pipeline's normaliser (from the labels) must be that sum, not 0.2's
    config = TrainerConfig(OptimizerKind.sgd(0.1), LossKind.weighted_cross_entropy([0.2, 1.0, 3.0]))
    model = Mlp(SIZES, seed=4)
    pipe = await PipelineParallelTrainer.spawn(actor_system, model, cpu_devices(2), config)
    ref = await Trainer.spawn(actor_system, model, "cpu:0", config)
    x, y = _batches(1)[0]
    a = await pipe.ask(Evaluate(x, y), timeout=T)
    b = await ref.ask(Evaluate(x, y), timeout=T)
    assert a.normaliser == b.normaliser
    assert a.loss == pytest.approx(b.loss, rel=1e-6)


async def test_the_default_micro_batch_is_a_quarter_of_the_batch(actor_system) -> None:
    model = Mlp(SIZES, activation="tanh", seed=8)
    config = TrainerConfig(OptimizerKind.adam(0.02), WCE)
    pipe = await PipelineParallelTrainer.spawn(actor_system, model, cpu_devices(3), config)
    ref = await Trainer.spawn(actor_system, model, "cpu:0", config)
    for x, y in _batches(3):
        a = await pipe.ask(Step(x, y), timeout=T)
        b = await ref.ask(Step(x, y), timeout=T)
        assert a.loss == pytest.approx(b.loss, rel=1e-5)
    timeline = await pipe.ask(GetTimeline(), timeout=T)
    assert (timeline.n_micro, timeline.schedule) == (5, "1f1b")  # 15 // 4 = 3 per micro-batch
    np.testing.assert_allclose(
        await pipe.ask(GetWeights(), timeout=T), await ref.ask(GetWeights(), timeout=T), atol=2e-5
    )
