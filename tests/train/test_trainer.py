"""The single-device Trainer actor: steps, accumulation, clipping, bad input,
checkpoints (resume bit-identical, atomic, corruption) and digits accuracy."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest

from atomr import ActorSystem
from atomr.train import (
    CheckpointError,
    Evaluate,
    GetWeights,
    InvalidBatchError,
    LoadCheckpoint,
    LossKind,
    Mlp,
    NonFiniteError,
    OptimizerKind,
    SaveCheckpoint,
    Step,
    StepStats,
    Trainer,
    TrainerConfig,
)
from atomr.train.core import GetTrainingState, load_digits_split, synthetic_classification
from atomr.train.core.model import Activation, Layer, Linear, Sequential, register_layer
from tests.train.train_reference import ref_cross_entropy

SIZES = [6, 16, 4]
CE = LossKind.CROSS_ENTROPY


def _data(n: int = 32, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    return synthetic_classification(n, SIZES[0], SIZES[-1], seed=seed)


def _config(**kw) -> TrainerConfig:
    kw.setdefault("optimizer", OptimizerKind.sgd(0.1))
    kw.setdefault("loss", CE)
    return TrainerConfig(**kw)


async def _weights(ref) -> np.ndarray:
    return await ref.ask(GetWeights(), timeout=10)


async def test_step_equals_numpy_gradient_descent() -> None:
    model = Mlp(SIZES, activation="tanh", seed=1)
    x, y = _data()
    async with ActorSystem() as system:
        ref = await Trainer.spawn(system, model, "cpu:0", _config(optimizer=OptimizerKind.sgd(0.5)))
        stats = await ref.ask(Step(x, y), timeout=10)
        after = await _weights(ref)
    # NumPy: forward, torch's cross-entropy gradient, backward, p -= lr * g
    p = model.get_params().astype(np.float64)
    w0, b0 = p[:96].reshape(6, 16), p[96:112]
    w1, b1 = p[112:176].reshape(16, 4), p[176:]
    z0 = x @ w0 + b0
    a0 = np.tanh(z0)
    value, dz1 = ref_cross_entropy(a0 @ w1 + b1, y)
    dz0 = (dz1 @ w1.T) * (1 - a0**2)
    g = np.concatenate([(x.T @ dz0).ravel(), dz0.sum(0), (a0.T @ dz1).ravel(), dz1.sum(0)])
    assert isinstance(stats, StepStats) and stats.applied and stats.samples == 32
    assert stats.loss == pytest.approx(value, rel=1e-5)
    assert stats.grad_norm == pytest.approx(np.linalg.norm(g), rel=1e-5)
    assert stats.step_micros > 0  # measured on the device, in whole microseconds
    np.testing.assert_allclose(after, p - 0.5 * g, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(model.get_params(), p.astype(np.float32))  # template untouched


async def test_math_runs_on_the_device_thread(monkeypatch) -> None:
    seen: list[int] = []
    original = Mlp.forward_train_unchecked

    def spy(self, *args, **kwargs):  # the step's first math: the model's forward
        seen.append(threading.get_ident())
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Mlp, "forward_train_unchecked", spy)
    x, y = _data()
    async with ActorSystem() as system:
        ref = await Trainer.spawn(system, Mlp(SIZES), "cpu:0", _config())
        await ref.ask(Step(x, y), timeout=10)
    assert seen and seen[0] != threading.get_ident()


@pytest.mark.parametrize("loss", [CE, LossKind.weighted_cross_entropy([1.0, 3.0, 0.5, 2.0])])
async def test_accumulation_equals_one_step_on_the_whole_batch(loss) -> None:
    x, y = _data(16, seed=3)
    cuts = [0, 5, 12, 16]  # uneven micro-batches
    opt = OptimizerKind.adam(1e-2)
    async with ActorSystem() as system:
        whole = await Trainer.spawn(
            system, Mlp(SIZES, seed=2), "cpu:0", _config(optimizer=opt, loss=loss)
        )
        accum = await Trainer.spawn(
            system,
            Mlp(SIZES, seed=2),
            "cpu:1",
            _config(optimizer=opt, loss=loss, accumulation_steps=3),
        )
        for _ in range(2):
            full = await whole.ask(Step(x, y), timeout=10)
            parts = [
                await accum.ask(Step(x[a:b], y[a:b]), timeout=10)
                for a, b in zip(cuts[:-1], cuts[1:], strict=True)
            ]
            assert [s.applied for s in parts] == [False, False, True]
            assert [s.samples for s in parts] == [5, 7, 4]
            assert parts[-1].loss == pytest.approx(full.loss, rel=1e-6)
            assert parts[-1].grad_norm == pytest.approx(full.grad_norm, rel=1e-5)
            np.testing.assert_allclose(
                await _weights(accum), await _weights(whole), rtol=1e-5, atol=1e-6
            )
        # micro-steps alone do not move the weights
        before = await _weights(accum)
        await accum.ask(Step(x[:5], y[:5]), timeout=10)
        np.testing.assert_array_equal(await _weights(accum), before)


async def test_gradient_clipping_reports_norm_before_clipping() -> None:
    x, y = _data()
    async with ActorSystem() as system:
        plain = await Trainer.spawn(
            system, Mlp(SIZES, seed=4), "cpu:0", _config(optimizer=OptimizerKind.sgd(1.0))
        )
        clipped = await Trainer.spawn(
            system,
            Mlp(SIZES, seed=4),
            "cpu:1",
            _config(optimizer=OptimizerKind.sgd(1.0), gradient_clip=0.01),
        )
        w0 = await _weights(plain)
        s_plain = await plain.ask(Step(x, y), timeout=10)
        s_clip = await clipped.ask(Step(x, y), timeout=10)
        assert s_clip.grad_norm == pytest.approx(s_plain.grad_norm, rel=1e-6)
        assert s_plain.grad_norm > 0.01
        step_plain = await _weights(plain) - w0
        step_clip = await _weights(clipped) - w0
    assert np.linalg.norm(step_clip) == pytest.approx(0.01, rel=1e-3)
    np.testing.assert_allclose(
        step_clip, step_plain * (0.01 / (s_plain.grad_norm + 1e-6)), rtol=1e-3, atol=1e-8
    )


async def test_bad_input_is_a_failure_and_leaves_weights_untouched() -> None:
    x, y = _data()
    huge = np.full_like(x, 3e38)  # finite input, non-finite activations and gradient
    bad = [
        (Step(x[:, :5], y), InvalidBatchError, "width"),
        (Step(x, y + 4), InvalidBatchError, "range"),
        (Step(x.astype(np.int32), y), InvalidBatchError, "float32"),
        (Step(x, y.astype(np.float32)), InvalidBatchError, "integers"),
        (Step(np.where(x > 1, np.nan, x), y), InvalidBatchError, "NaN"),
        (Step(np.where(x > 1, np.inf, x), y), InvalidBatchError, "Inf"),
        (Step(huge, y), NonFiniteError, "not finite"),
        (Evaluate(x, y[:3]), InvalidBatchError, "shape"),
    ]
    async with ActorSystem() as system:
        for kind in (OptimizerKind.adam(1e-2), OptimizerKind.sgd(0.1, momentum=0.9)):
            ref = await Trainer.spawn(
                system, Mlp(SIZES, seed=5), "cpu:0", _config(optimizer=kind, accumulation_steps=1)
            )
            await ref.ask(Step(x, y), timeout=10)
            before = await _weights(ref)
            for message, error, match in bad:
                with pytest.raises(error, match=match):
                    await ref.ask(message, timeout=10)
                np.testing.assert_array_equal(await _weights(ref), before)
            # the actor was not restarted: its state (weights, optimizer) carried on
            s = await ref.ask(Step(x, y), timeout=10)
            assert s.applied
            assert not np.array_equal(await _weights(ref), before)
            ref.stop()


async def test_evaluate_reports_loss_and_accuracy_without_training() -> None:
    x, y = _data(50, seed=6)
    model = Mlp(SIZES, seed=6)
    async with ActorSystem() as system:
        ref = await Trainer.spawn(system, model, "cpu:0", _config())
        result = await ref.ask(Evaluate(x, y), timeout=10)
        np.testing.assert_array_equal(await _weights(ref), model.get_params())
    logits = model.forward(x)
    assert result.samples == 50
    assert result.loss == pytest.approx(ref_cross_entropy(logits, y)[0], rel=1e-5)
    assert result.accuracy == pytest.approx(np.mean(np.argmax(logits, 1) == y))


async def test_mse_trainer_steps() -> None:
    x, _ = _data()
    t = np.random.default_rng(0).standard_normal((32, 4)).astype(np.float32)
    async with ActorSystem() as system:
        ref = await Trainer.spawn(
            system,
            Mlp(SIZES, seed=7),
            "cpu:0",
            _config(loss=LossKind.MSE, optimizer=OptimizerKind.sgd(0.05)),
        )
        first = await ref.ask(Step(x, t), timeout=10)
        for _ in range(20):
            last = await ref.ask(Step(x, t), timeout=10)
        result = await ref.ask(Evaluate(x, t), timeout=10)
    assert last.loss < first.loss
    assert np.isnan(result.accuracy)


async def _run(steps, model, config, batches, ckpt_in=None, ckpt_out=None, device="cpu:0"):
    async with ActorSystem() as system:
        ref = await Trainer.spawn(system, model, device, config)
        if ckpt_in is not None:
            await ref.ask(LoadCheckpoint(ckpt_in), timeout=10)
        for x, y in batches[steps[0] : steps[1]]:
            await ref.ask(Step(x, y), timeout=10)
        if ckpt_out is not None:
            await ref.ask(SaveCheckpoint(ckpt_out), timeout=10)
        return await _weights(ref)


@pytest.mark.parametrize(
    "optimizer,accumulation,cut",
    [
        (OptimizerKind.adamw(1e-2), 1, 5),
        (OptimizerKind.sgd(0.1, momentum=0.9, nesterov=True, weight_decay=1e-3), 1, 5),
        (OptimizerKind.adam(1e-2), 2, 5),  # saved in the middle of an accumulation
    ],
)
async def test_save_kill_load_continue_is_bit_identical(
    tmp_path: Path, optimizer, accumulation, cut
) -> None:
    config = _config(optimizer=optimizer, accumulation_steps=accumulation, gradient_clip=5.0)
    batches = [_data(12, seed=s) for s in range(10)]
    path = tmp_path / "t.ckpt"
    straight = await _run((0, 10), Mlp(SIZES, seed=8), config, batches)
    await _run((0, cut), Mlp(SIZES, seed=8), config, batches, ckpt_out=path)
    # a new system and a new actor, from a model with other initial weights
    resumed = await _run(
        (cut, 10), Mlp(SIZES, seed=99), config, batches, ckpt_in=path, device="cpu:1"
    )
    np.testing.assert_array_equal(resumed, straight)


async def test_a_wider_float_checkpoint_is_refused_and_a_narrower_one_loads_exactly(
    tmp_path: Path,
) -> None:
    """float64 weights into a float32 trainer would be rounded: refused, with
    nothing changed (they were cast silently). float32 into float64 is exact."""
    wide, narrow = tmp_path / "f64.ckpt", tmp_path / "f32.ckpt"
    async with ActorSystem() as system:
        f64 = await Trainer.spawn(system, Mlp(SIZES, seed=1, dtype=np.float64), "cpu:0", _config())
        f32 = await Trainer.spawn(system, Mlp(SIZES, seed=2), "cpu:1", _config())
        await f64.ask(SaveCheckpoint(wide), timeout=10)
        await f32.ask(SaveCheckpoint(narrow), timeout=10)
        before = await _weights(f32)
        with pytest.raises(CheckpointError, match="float64, this model is float32"):
            await f32.ask(LoadCheckpoint(wide), timeout=10)
        np.testing.assert_array_equal(await _weights(f32), before)
        await f64.ask(LoadCheckpoint(narrow), timeout=10)
        loaded = await _weights(f64)
        assert loaded.dtype == np.float64
        np.testing.assert_array_equal(loaded, before.astype(np.float64))


async def test_checkpoint_errors_leave_the_trainer_unchanged(tmp_path: Path, monkeypatch) -> None:
    x, y = _data()
    good, other = tmp_path / "good.ckpt", tmp_path / "other.ckpt"
    async with ActorSystem() as system:
        small = await Trainer.spawn(system, Mlp([6, 8, 4], seed=1), "cpu:1", _config())
        await small.ask(SaveCheckpoint(other), timeout=10)
        ref = await Trainer.spawn(system, Mlp(SIZES, seed=1), "cpu:0", _config())
        await ref.ask(Step(x, y), timeout=10)
        await ref.ask(SaveCheckpoint(good), timeout=10)
        saved = await _weights(ref)
        await ref.ask(Step(x, y), timeout=10)
        current = await _weights(ref)
        # another model shape
        with pytest.raises(CheckpointError, match="model"):
            await ref.ask(LoadCheckpoint(other), timeout=10)
        # corrupted and truncated files
        data = good.read_bytes()
        bad = tmp_path / "bad.ckpt"
        bad.write_bytes(data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])
        with pytest.raises(CheckpointError, match="checksum"):
            await ref.ask(LoadCheckpoint(bad), timeout=10)
        bad.write_bytes(data[: len(data) // 2])
        with pytest.raises(CheckpointError):
            await ref.ask(LoadCheckpoint(bad), timeout=10)
        with pytest.raises(FileNotFoundError):
            await ref.ask(LoadCheckpoint(tmp_path / "missing.ckpt"), timeout=10)
        np.testing.assert_array_equal(await _weights(ref), current)
        # a crash mid-save leaves the previous checkpoint intact
        monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(OSError("crash")))
        with pytest.raises(OSError, match="crash"):
            await ref.ask(SaveCheckpoint(good), timeout=10)
        monkeypatch.undo()
        assert good.read_bytes() == data
        await ref.ask(LoadCheckpoint(good), timeout=10)
        np.testing.assert_array_equal(await _weights(ref), saved)


async def test_digits_reaches_95_percent() -> None:
    x_tr, y_tr, x_te, y_te = load_digits_split(seed=0)
    rng = np.random.default_rng(0)
    async with ActorSystem() as system:
        ref = await Trainer.spawn(
            system, Mlp([64, 64, 10], seed=0), "cpu:0", _config(optimizer=OptimizerKind.adam(1e-2))
        )
        for _ in range(10):
            order = rng.permutation(len(y_tr))
            for i in range(0, len(order), 64):
                idx = order[i : i + 64]
                await ref.ask(Step(x_tr[idx], y_tr[idx]), timeout=10)
        result = await ref.ask(Evaluate(x_te, y_te), timeout=10)
    assert result.samples == len(y_te)
    assert result.accuracy >= 0.95


def _tamper_missing_accum_loss(ckpt) -> None:
    del ckpt.extra["accum_loss"]


def _tamper_short_accum(ckpt) -> None:
    ckpt.extra["accum_grads"] = np.zeros(3, np.float32)


def _tamper_micro_not_a_number(ckpt) -> None:
    ckpt.extra["micro"] = "x"


def _tamper_nan_accum_norm(ckpt) -> None:
    ckpt.extra["accum_norm"] = float("nan")


def _tamper_negative_accum_norm(ckpt) -> None:
    ckpt.extra["accum_norm"] = -4.0


def _tamper_accum_beyond_float32(ckpt) -> None:
    ckpt.extra["accum_grads"] = np.full(ckpt.weights.shape, 1e300)


def _tamper_fractional_micro(ckpt) -> None:
    ckpt.extra["micro"] = 1.9


def _tamper_micro_as_text(ckpt) -> None:
    ckpt.extra["micro"] = "1"


def _tamper_micro_as_bool(ckpt) -> None:
    ckpt.extra["micro"] = True


def _tamper_negative_micro(ckpt) -> None:
    ckpt.extra["micro"] = -3


def _tamper_accum_loss_as_text(ckpt) -> None:
    ckpt.extra["accum_loss"] = "0.5"


def _tamper_string_weights(ckpt) -> None:
    ckpt.weights = np.array(["a"] * len(ckpt.weights))


@pytest.mark.parametrize(
    "tamper",
    [
        _tamper_missing_accum_loss,
        _tamper_short_accum,
        _tamper_micro_not_a_number,
        _tamper_nan_accum_norm,
        _tamper_negative_accum_norm,
        _tamper_accum_beyond_float32,
        _tamper_fractional_micro,
        _tamper_micro_as_text,
        _tamper_micro_as_bool,
        _tamper_negative_micro,
        _tamper_accum_loss_as_text,
        _tamper_string_weights,
    ],
)
async def test_malformed_checkpoint_state_is_a_checkpoint_error(tmp_path: Path, tamper) -> None:
    """A well-formed file (valid checksum) whose content does not fit is
    refused with CheckpointError before anything changes; the actor keeps
    its state (it is not restarted) and the next Step works."""
    from atomr.train import load_checkpoint
    from atomr.train.core import save_checkpoint

    x, y = _data()
    config = _config(accumulation_steps=2)
    good, bad = tmp_path / "good.ckpt", tmp_path / "bad.ckpt"
    async with ActorSystem() as system:
        ref = await Trainer.spawn(system, Mlp(SIZES, seed=2), "cpu:0", config)
        assert not (await ref.ask(Step(x, y), timeout=10)).applied  # one micro-step pending
        await ref.ask(SaveCheckpoint(good), timeout=10)
        ckpt = load_checkpoint(good)
        tamper(ckpt)
        save_checkpoint(bad, ckpt)
        before = await _weights(ref)
        with pytest.raises(CheckpointError):
            await ref.ask(LoadCheckpoint(bad), timeout=10)
        np.testing.assert_array_equal(await _weights(ref), before)
        # the pending micro-step survived: this Step completes the accumulation
        assert (await ref.ask(Step(x, y), timeout=10)).applied


@pytest.mark.parametrize("k", [2, 3])
async def test_a_failed_micro_step_abandons_the_window_as_in_data_parallel(k: int) -> None:
    """A micro-step whose loss is not finite (float64 features of 1e300)
    fails in both trainers, and both then open a new window: their next `k`
    steps apply alike (before, the `Trainer` kept its window and applied one
    `Step` sooner than `DataParallelTrainer`, docs/data_parallel.md). A batch
    refused by validation (a NaN) keeps the window in both."""
    from atomr.accel import cpu_devices
    from atomr.train import DataParallelTrainer

    x, y = _data(8)
    x = x.astype(np.float64)
    runs = []
    async with ActorSystem() as system:
        for trainer_class, n in ((Trainer, 1), (DataParallelTrainer, 2)):
            model = Mlp(SIZES, seed=3, dtype=np.float64)
            config = _config(accumulation_steps=k)
            ref = await trainer_class.spawn(system, model, cpu_devices(n), config)
            assert not (await ref.ask(Step(x, y), timeout=60)).applied
            with pytest.raises(InvalidBatchError):
                await ref.ask(Step(np.where(x > 0.5, np.nan, x), y), timeout=60)
            with pytest.raises(NonFiniteError):
                await ref.ask(Step(x * 1e300, y), timeout=60)
            applied = [(await ref.ask(Step(x, y), timeout=60)).applied for _ in range(k)]
            runs.append((applied, await _weights(ref)))
    assert runs[0][0] == runs[1][0] == [False] * (k - 1) + [True]
    np.testing.assert_allclose(runs[0][1], runs[1][1], rtol=1e-9, atol=1e-12)


async def test_spawn_takes_one_device_and_no_options() -> None:
    """The trainer contract: `devices` is one device or a sequence of one;
    anything else, or any options, is refused before anything is spawned."""
    async with ActorSystem() as system:
        for devices in ("cpu:0", ["cpu:0"]):
            ref = await Trainer.spawn(system, Mlp(SIZES), devices, _config())
            assert (await _weights(ref)).shape == (Mlp(SIZES).n_params,)
        before = system.actors
        mistakes = [
            ({"devices": ["cpu:0", "cpu:1"]}, ValueError, "one device"),
            ({"devices": []}, ValueError, "at least one device"),
            ({"devices": [0]}, TypeError, r"devices\[0\]"),
            ({"devices": "gpu:0"}, ValueError, "unknown device"),
            ({"options": object()}, TypeError, "no options of its own"),
            ({"model": "model"}, TypeError, "model"),
            ({"config": None}, TypeError, "config"),
            ({"name": 7}, TypeError, "name"),
            ({"system": None}, TypeError, "system"),
        ]
        for given, error, names in mistakes:
            args = {"system": system, "model": Mlp(SIZES), "devices": "cpu:0"}
            args |= {"config": _config(), "options": None, "name": None} | given
            with pytest.raises(error, match=names):
                await Trainer.spawn(**args)
        assert system.actors == before
        with pytest.raises(TypeError, match="no options"):
            Trainer.props(Mlp(SIZES), "cpu:0", _config(), object())  # type: ignore[arg-type]


@register_layer
class RaisesWhenTold(Layer):
    """The identity, raising `RuntimeError` in forward while `FAIL` is set
    (a custom layer's bug)."""

    kind = "raises-when-told-test"
    FAIL = threading.Event()

    def param_shapes(self) -> list[tuple[int, ...]]:
        return []

    def init_params(self, rng: np.random.Generator) -> list[np.ndarray]:
        return []

    def out_shape(self, in_shape: tuple[int, ...]) -> tuple[int, ...]:
        return in_shape

    def forward(self, be, params, x, ctx):  # noqa: ANN001, ANN201
        if self.FAIL.is_set():
            raise RuntimeError("a bug in a custom layer")
        return x, None

    def backward(self, be, params, grads, saved, dy, accumulate, input_grad):  # noqa: ANN001, ANN201
        return dy if input_grad else None

    def config(self) -> dict[str, object]:
        return {"kind": self.kind}


async def test_a_layers_bug_fails_the_step_and_keeps_the_training() -> None:
    # was: the actor restarted from the model's initial weights and step 0,
    # and the next Step went on from there as if nothing had been trained
    x, y = _data()
    model = Sequential(
        [Linear(6, 16), Activation("relu"), RaisesWhenTold(), Linear(16, 4)], (6,), seed=5
    )
    async with ActorSystem() as system:
        ref = await Trainer.spawn(
            system, model, "cpu:0", _config(optimizer=OptimizerKind.adam(1e-2))
        )
        for _ in range(3):
            await ref.ask(Step(x, y), timeout=10)
        before = await _weights(ref)
        RaisesWhenTold.FAIL.set()
        try:
            with pytest.raises(Exception, match="a bug in a custom layer"):
                await ref.ask(Step(x, y), timeout=10)
        finally:
            RaisesWhenTold.FAIL.clear()
        np.testing.assert_array_equal(await _weights(ref), before)
        assert (await ref.ask(GetTrainingState(), timeout=10)).step == 3
        assert (await ref.ask(Step(x, y), timeout=10)).applied


async def test_a_step_checks_its_batch_once_an_evaluation_and_a_bad_batch_as_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A `Step`'s batch is checked by validation only (the model's own check
    of the same shape and dtype, `check_input_batch`, is not repeated); an
    `Evaluate` still runs it, and a bad batch is refused with nothing changed."""
    from atomr.train.core.model import sequential

    calls: list[tuple[int, ...]] = []
    check = sequential.check_input_batch

    def spy(x: object, in_shape: tuple[int, ...], input_kind: str) -> None:
        calls.append(in_shape)
        check(x, in_shape, input_kind)

    monkeypatch.setattr(sequential, "check_input_batch", spy)
    x, y = _data(8)
    async with ActorSystem() as system:
        ref = await Trainer.spawn(system, Mlp(SIZES, seed=1), "cpu:0", _config())
        before = await _weights(ref)
        with pytest.raises(InvalidBatchError):
            await ref.ask(Step(x[:, :3], y), timeout=10)
        np.testing.assert_array_equal(await _weights(ref), before)
        assert (await ref.ask(Step(x, y), timeout=10)).applied
        assert calls == []
        await ref.ask(Evaluate(x, y), timeout=10)
        assert calls == [(SIZES[0],)]
    with pytest.raises(ValueError, match="inputs of shape"):
        Mlp(SIZES).forward_train(x[:, :3])


async def test_a_step_trains_on_the_validated_batch_whatever_the_caller_does_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The batch a `Step` trains on is its own from validation on: a caller
    that changes its arrays before the step's job runs (it stopped waiting,
    say) changes nothing, and the step itself writes into neither array
    (on a CPU device it uses them without a copy)."""
    x, y = _data(8)
    original, runs = Trainer._step, []
    for mutate in (False, True):
        features, labels = x.copy(), y.copy()

        def step(self, bx, by, mutate=mutate, caller=(features, labels)):  # the job, as it starts
            if mutate:
                caller[0].fill(1e30)  # the caller's own arrays
                caller[1].fill(-1)
            kept = (bx.copy(), by.copy())
            stats = original(self, bx, by)
            np.testing.assert_array_equal(bx, kept[0])
            np.testing.assert_array_equal(by, kept[1])
            return stats

        monkeypatch.setattr(Trainer, "_step", step)
        async with ActorSystem() as system:
            ref = await Trainer.spawn(system, Mlp(SIZES, seed=4), "cpu:0", _config())
            stats = await ref.ask(Step(features, labels), timeout=10)
            runs.append((stats.loss, await _weights(ref)))
    assert runs[0][0] == runs[1][0]
    np.testing.assert_array_equal(runs[0][1], runs[1][1])
