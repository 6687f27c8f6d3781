"""`fit`: the one epoch loop. It trains any trainer, resumes at the exact
batch where a checkpoint was taken, and refuses bad arguments before a step."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import numpy as np
import pytest

from atomr import Actor, ActorSystem, Props
from atomr.train import (
    GetWeights,
    LoadCheckpoint,
    LossKind,
    Mlp,
    OptimizerKind,
    StepStats,
    Trainer,
    TrainerConfig,
)
from atomr.train.core import InvalidBatchError, synthetic_classification
from atomr.train.fit import (
    EpochRecord,
    FitCallback,
    FitPosition,
    StopFlag,
    batch_bounds,
    epoch_order,
    fit,
)

CONFIG = TrainerConfig(OptimizerKind.adam(0.01), LossKind.CROSS_ENTROPY)


def _data(n: int = 100) -> tuple[np.ndarray, np.ndarray]:
    return synthetic_classification(n, 6, 3, seed=1)


class _Recorder(FitCallback):
    def __init__(self, stop: StopFlag | None = None, stop_at: int | None = None) -> None:
        self.steps: list[tuple[int, int, int]] = []
        self.epochs: list[EpochRecord] = []
        self.saved: list[FitPosition] = []
        self.started: list[int] = []
        self.stop, self.stop_at = stop, stop_at

    def on_epoch_start(self, epoch: int, epochs: int) -> None:
        self.started.append(epoch)

    def on_step(
        self, position: FitPosition, stats: StepStats, mean_loss: float, rate: float
    ) -> None:
        self.steps.append((position.epoch, position.batch, position.step))
        if self.stop is not None and position.step == self.stop_at:
            self.stop.request()

    def on_epoch_end(self, record: EpochRecord, epochs: int) -> None:
        self.epochs.append(record)

    def on_checkpoint(self, path: Path, position: FitPosition) -> None:
        self.saved.append(position)


def test_batch_bounds_and_order() -> None:
    assert batch_bounds(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert batch_bounds(10, 4, min_batch_size=3) == [(0, 4), (4, 8)]
    with pytest.raises(ValueError, match="below the smallest"):
        batch_bounds(10, 2, min_batch_size=3)
    with pytest.raises(ValueError, match="smaller than one batch"):
        batch_bounds(2, 4, min_batch_size=3)
    a, b = epoch_order(50, 3, 1), epoch_order(50, 3, 1)
    assert np.array_equal(a, b) and sorted(a) == list(range(50))
    assert not np.array_equal(epoch_order(50, 3, 1), epoch_order(50, 3, 2))


async def test_fit_trains_and_reports_every_epoch(tmp_path: Path) -> None:
    x, y = _data()
    rec = _Recorder()
    async with ActorSystem("fit") as system:
        trainer = await Trainer.spawn(system, Mlp([6, 8, 3], seed=0), "cpu:0", CONFIG)
        result = await fit(
            trainer,
            (x, y),
            validation=(x[:20], y[:20]),
            epochs=3,
            batch_size=32,
            checkpoint=tmp_path / "c.ckpt",
            callbacks=[rec],
        )
    assert result.status == "finished"
    assert (result.position.epoch, result.position.batch, result.position.step) == (3, 0, 12)
    assert rec.started == [1, 2, 3]
    assert [r.epoch for r in result.epochs] == [1, 2, 3] and rec.epochs == result.epochs
    assert result.epochs[-1].train_loss < result.epochs[0].train_loss
    assert all(0.0 <= r.test_accuracy <= 1.0 for r in result.epochs)
    # after epochs 1 and 2, and at the end
    assert [(p.epoch, p.step) for p in rec.saved] == [(1, 4), (2, 8), (3, 12)]


async def test_stopped_then_resumed_equals_uninterrupted(tmp_path: Path) -> None:
    x, y = _data()
    async with ActorSystem("fit") as system:
        straight = await Trainer.spawn(system, Mlp([6, 8, 3], seed=0), "cpu:0", CONFIG)
        await fit(straight, (x, y), epochs=2, batch_size=16, seed=5)
        expected = await straight.ask(GetWeights())

        stop = StopFlag()
        first = await Trainer.spawn(system, Mlp([6, 8, 3], seed=0), "cpu:0", CONFIG)
        ckpt = tmp_path / "s.ckpt"
        rec = _Recorder(stop, stop_at=9)
        stopped = await fit(
            first,
            (x, y),
            epochs=2,
            batch_size=16,
            seed=5,
            checkpoint=ckpt,
            callbacks=[rec],
            stop=stop,
        )
        assert stopped.status == "interrupted"
        assert (stopped.position.epoch, stopped.position.batch) == (1, 2)
        assert rec.saved[-1] == stopped.position

        second = await Trainer.spawn(system, Mlp([6, 8, 3], seed=9), "cpu:0", CONFIG)
        await second.ask(LoadCheckpoint(str(ckpt)))
        again = _Recorder()
        result = await fit(
            second, (x, y), epochs=2, batch_size=16, seed=5, start=stopped.position,
            callbacks=[again],
        )  # fmt: skip
        assert result.status == "finished"
        assert again.steps[0] == (1, 3, 10)
        assert len(again.steps) == 7 - 2
        np.testing.assert_array_equal(await second.ask(GetWeights()), expected)


@pytest.mark.parametrize(
    ("kwargs", "error", "needle"),
    [
        ({"epochs": 0}, ValueError, "epochs must be >= 1"),
        ({"epochs": 1.5}, TypeError, "epochs must be an int"),
        ({"batch_size": 0}, ValueError, "batch_size must be >= 1"),
        ({"seed": -1}, ValueError, "seed must be >= 0"),
        ({"train": (np.zeros((4, 6)), np.zeros(3))}, ValueError, "differ in length"),
        ({"train": np.zeros((4, 6))}, TypeError, "(features, labels) pair"),
        ({"start": FitPosition(epoch=2)}, ValueError, "pass epochs > 2"),
        ({"start": FitPosition(batch=99)}, ValueError, "past the epoch"),
        ({"batch_size": 4, "min_batch_size": 5}, ValueError, "below the smallest usable 5"),
        ({"validation": (np.zeros((0, 6)), np.zeros(0))}, ValueError, "validation: the set (0"),
        ({"train": (np.zeros((0, 6)), np.zeros(0))}, ValueError, "train: the set (0 samples)"),
        ({"min_batch_size": True}, TypeError, "min_batch_size must be an int, got True"),
        ({"min_batch_size": "2"}, TypeError, "min_batch_size must be an int, got '2'"),
        ({"min_batch_size": 0}, ValueError, "min_batch_size must be >= 1, got 0"),
        ({"stop": True}, TypeError, "stop must be a StopFlag or None, got bool"),
        ({"callbacks": [object()]}, TypeError, "FitCallback instances, got object"),
        ({"callbacks": _Recorder()}, TypeError, "a sequence of FitCallback, got _Recorder"),
        ({"evaluate": 3}, TypeError, "evaluate must be callable"),
        ({"agree_to_stop": "yes"}, TypeError, "agree_to_stop must be callable"),
        ({"timeout": -1.0}, ValueError, "timeout must be > 0"),
        ({"timeout": "60"}, TypeError, "timeout must be a number"),
    ],
)
async def test_bad_arguments_are_refused_before_any_step(
    kwargs: dict[str, object], error: type[Exception], needle: str
) -> None:
    x, y = _data()
    args: dict[str, object] = {"train": (x, y), "epochs": 2, "batch_size": 16}
    args.update(kwargs)
    async with ActorSystem("fit") as system:
        trainer = await Trainer.spawn(system, Mlp([6, 8, 3], seed=0), "cpu:0", CONFIG)
        before = await trainer.ask(GetWeights())
        with pytest.raises(error, match=needle.replace("(", r"\(").replace(")", r"\)")):
            await fit(trainer, **args)  # type: ignore[arg-type]
        np.testing.assert_array_equal(await trainer.ask(GetWeights()), before)


async def test_a_trainer_that_is_no_actor_ref_is_refused_saying_what_to_pass() -> None:
    """A forgotten `await` on `spawn` (or the trainer class itself) is a
    TypeError that says so, not an AttributeError about `ask`."""
    x, y = _data()
    async with ActorSystem("fit") as system:
        spawning = Trainer.spawn(system, Mlp([6, 8, 3], seed=0), "cpu:0", CONFIG)
        try:
            with pytest.raises(TypeError, match=r"got an un-awaited coroutine: write `ref = await"):
                await fit(spawning, (x, y), epochs=1, batch_size=16)  # type: ignore[arg-type]
        finally:
            spawning.close()
        with pytest.raises(TypeError, match="got the class Trainer: spawn it first"):
            await fit(Trainer, (x, y), epochs=1, batch_size=16)  # type: ignore[arg-type]


class _AnswersNone(Actor):
    """A trainer of one's own whose `receive` forgets to return its reply."""

    def receive(self, message: object) -> None:
        return None


@pytest.mark.parametrize("validation", [False, True])
async def test_a_trainer_that_answers_no_stats_is_a_type_error_not_a_quiet_stop(
    validation: bool,
) -> None:
    """A `Step` answered with None was taken for a step limit: `fit`
    returned "interrupted" after no step, and an `Evaluate` answered with
    None failed with an AttributeError on `normaliser`."""
    x, y = _data()
    async with ActorSystem("fit") as system:
        mute = system.spawn(Props(_AnswersNone))
        needle = "answered Evaluate with None, not EvalResult" if validation else "answered Step"
        with pytest.raises(TypeError, match=needle):
            await fit(
                mute, (x, y), epochs=1, batch_size=16, validation=(x, y) if validation else None
            )


@pytest.mark.parametrize(
    "validation",
    [
        pytest.param(lambda x, y: (x[:, :5], y), id="narrow-arrays"),
        pytest.param(lambda x, y: [(x[:8, :5], y[:8])], id="narrow-batches"),
        pytest.param(lambda x, y: (x, y.astype(np.float32)), id="float-labels"),
    ],
)
async def test_a_validation_set_the_trainer_refuses_fails_before_any_step(
    validation: object,
) -> None:
    x, y = _data()
    async with ActorSystem("fit") as system:
        trainer = await Trainer.spawn(system, Mlp([6, 8, 3], seed=0), "cpu:0", CONFIG)
        before = await trainer.ask(GetWeights())
        rec = _Recorder()
        with pytest.raises(InvalidBatchError) as caught:
            await fit(
                trainer, (x, y), validation=validation(x, y), epochs=1, batch_size=16,  # type: ignore[operator]
                callbacks=[rec],
            )  # fmt: skip
        assert "in the validation set" in "".join(caught.value.__notes__)
        assert rec.steps == []
        np.testing.assert_array_equal(await trainer.ask(GetWeights()), before)


def _unwritable_folder(kind: str, tmp_path: Path) -> Path:
    """A folder that exists but takes no new file: sysfs refuses one even to
    root; a folder without write permission only stops another user."""
    if kind == "sysfs":
        if not Path("/sys/kernel").is_dir():
            pytest.skip("no /sys on this system")
        return Path("/sys/kernel")
    if os.geteuid() == 0:
        pytest.skip("root writes in a folder without write permission")
    tmp_path.chmod(0o500)
    return tmp_path


@pytest.mark.parametrize("kind", ["sysfs", "no-permission"])
async def test_a_checkpoint_folder_that_cannot_be_written_is_refused_before_any_step(
    kind: str, tmp_path: Path
) -> None:
    folder = _unwritable_folder(kind, tmp_path)
    x, y = _data()
    try:
        async with ActorSystem("fit") as system:
            trainer = await Trainer.spawn(system, Mlp([6, 8, 3], seed=0), "cpu:0", CONFIG)
            before = await trainer.ask(GetWeights())
            rec = _Recorder()
            with pytest.raises(OSError) as caught:
                await fit(
                    trainer, (x, y), epochs=1, batch_size=16, checkpoint=folder / "c.ckpt",
                    callbacks=[rec],
                )  # fmt: skip
            assert "a test write for the checkpoint" in "".join(caught.value.__notes__)
            assert rec.started == [] and rec.steps == []
            np.testing.assert_array_equal(await trainer.ask(GetWeights()), before)
    finally:
        tmp_path.chmod(0o700)


async def _answers_no(requested: bool) -> object:
    return "no"


@pytest.mark.parametrize(
    ("agree", "needle"),
    [
        (_answers_no, "agree_to_stop's answer must be True or False, got 'no'"),
        (lambda requested: False, "agree_to_stop must be an async function .* returned bool"),
    ],
)
async def test_an_agree_to_stop_that_answers_no_bool_is_refused_not_taken_by_its_truth(
    agree: object, needle: str
) -> None:
    """Before any step, even in a run of one epoch (it was first called at
    the first epoch's end: never in a run of one, after an epoch's training
    in a longer one)."""
    x, y = _data()
    async with ActorSystem("fit") as system:
        trainer = await Trainer.spawn(system, Mlp([6, 8, 3], seed=0), "cpu:0", CONFIG)
        before = await trainer.ask(GetWeights())
        with pytest.raises(TypeError, match=needle):
            await fit(trainer, (x, y), epochs=1, batch_size=16, agree_to_stop=agree)  # type: ignore[arg-type]
        np.testing.assert_array_equal(await trainer.ask(GetWeights()), before)


async def test_a_jobs_stop_requested_before_the_first_step_is_agreed_before_it(
    tmp_path: Path,
) -> None:
    """A stop that came while the job started (a Ctrl-C) stops every
    process before any step, the checkpoint saved where the run starts (it
    trained the whole first epoch before its first agreement)."""
    heard: list[bool] = []

    async def agree(requested: bool) -> bool:
        heard.append(requested)
        return requested

    x, y = _data()
    stop, seen = StopFlag(), _Recorder()
    stop.request()
    async with ActorSystem("fit") as system:
        trainer = await Trainer.spawn(system, Mlp([6, 8, 3], seed=0), "cpu:0", CONFIG)
        before = await trainer.ask(GetWeights())
        result = await fit(
            trainer, (x, y), epochs=2, batch_size=16, stop=stop, agree_to_stop=agree,
            checkpoint=tmp_path / "c", callbacks=[seen],
        )  # fmt: skip
        np.testing.assert_array_equal(await trainer.ask(GetWeights()), before)
    assert (result.status, result.position, heard) == ("interrupted", FitPosition(), [True])
    assert (seen.steps, seen.saved) == ([], [FitPosition()])


async def test_a_refused_training_batch_saves_the_checkpoint_at_it(tmp_path: Path) -> None:
    """A bad sample part way through: the steps before it are kept in the
    checkpoint, a note says which batch, and a resume with the data mended
    ends where a run on mended data ends."""
    x, y = _data()
    bad = y.copy()
    order = epoch_order(len(y), 5, 0)
    bad[order[16 * 3 + 2]] = 7  # a label out of range in the fourth batch of epoch 1
    ckpt = tmp_path / "r.ckpt"
    async with ActorSystem("fit") as system:
        straight = await Trainer.spawn(system, Mlp([6, 8, 3], seed=0), "cpu:0", CONFIG)
        await fit(straight, (x, y), epochs=1, batch_size=16, seed=5)
        first = await Trainer.spawn(system, Mlp([6, 8, 3], seed=0), "cpu:0", CONFIG)
        rec = _Recorder()
        with pytest.raises(InvalidBatchError, match="labels must be in") as caught:
            await fit(
                first, (x, bad), epochs=1, batch_size=16, seed=5, checkpoint=ckpt,
                callbacks=[rec],
            )  # fmt: skip
        note = "".join(caught.value.__notes__)
        assert "epoch 1, batch 3" in note and "holds the 3 steps" in note
        assert rec.saved == [FitPosition(epoch=0, batch=3, step=3)]
        second = await Trainer.spawn(system, Mlp([6, 8, 3], seed=9), "cpu:0", CONFIG)
        await second.ask(LoadCheckpoint(str(ckpt)))
        await fit(second, (x, y), epochs=1, batch_size=16, seed=5, start=rec.saved[0])
        np.testing.assert_array_equal(
            await second.ask(GetWeights()), await straight.ask(GetWeights())
        )


class _Keeps(FitCallback):
    """Keeps every position it hears of."""

    def __init__(self) -> None:
        self.kept: list[FitPosition] = []

    def on_step(
        self, position: FitPosition, stats: StepStats, mean_loss: float, rate: float
    ) -> None:
        self.kept.append(position)

    def on_checkpoint(self, path: Path, position: FitPosition) -> None:
        self.kept.append(position)


class _Moves(FitCallback):
    """Moves every position it hears of back to the start (a careless callback)."""

    def on_step(
        self, position: FitPosition, stats: StepStats, mean_loss: float, rate: float
    ) -> None:
        position.epoch, position.batch, position.step = 0, 0, 0

    def on_checkpoint(self, path: Path, position: FitPosition) -> None:
        position.epoch, position.batch, position.step = 0, 0, 0


async def test_each_callback_gets_a_position_of_its_own(tmp_path: Path) -> None:
    x, y = _data(64)
    keeps, after = _Keeps(), _Keeps()
    async with ActorSystem("fit") as system:
        trainer = await Trainer.spawn(system, Mlp([6, 8, 3], seed=0), "cpu:0", CONFIG)
        async with asyncio.timeout(60):  # moving the run's own position looped for ever
            result = await fit(
                trainer,
                (x, y),
                epochs=2,
                batch_size=32,
                checkpoint=tmp_path / "c.ckpt",
                callbacks=[keeps, _Moves(), after],
            )
    expected = [(0, 1, 1), (0, 2, 2), (1, 0, 2), (1, 1, 3), (1, 2, 4), (2, 0, 4)]
    assert [(p.epoch, p.batch, p.step) for p in keeps.kept] == expected
    assert [(p.epoch, p.batch, p.step) for p in after.kept] == expected
    assert (result.position.epoch, result.position.batch, result.position.step) == (2, 0, 4)
