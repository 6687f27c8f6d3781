"""The edges of `fit`'s loop: a stop on an epoch's last batch saves a
position that resumes; a failed evaluation keeps the epoch's training; bad
`start`, `checkpoint` and data are refused before any step or named; one
`fit` per trainer at a time."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atomr import ActorRef, ActorSystem
from atomr.train import (
    GetWeights,
    LoadCheckpoint,
    LossKind,
    Mlp,
    OptimizerKind,
    Trainer,
    TrainerConfig,
)
from atomr.train.core import GetTrainingState, synthetic_classification
from atomr.train.core.sources import InvalidDataError
from atomr.train.fit import DataSourceError, FitCallback, FitPosition, StopFlag, fit

CONFIG = TrainerConfig(OptimizerKind.adam(0.01), LossKind.CROSS_ENTROPY)
X, Y = synthetic_classification(40, 6, 3, seed=1)  # batch 8: five batches an epoch


async def _trainer(system: ActorSystem, seed: int = 0) -> ActorRef:
    return await Trainer.spawn(system, Mlp([6, 8, 3], seed=seed), "cpu:0", CONFIG)


class _StopAt(FitCallback):
    def __init__(self, stop: StopFlag, step: int) -> None:
        self.stop, self.step, self.saved = stop, step, []  # type: ignore[var-annotated]

    def on_step(self, position: FitPosition, *_: Any) -> None:
        if position.step == self.step:
            self.stop.request()

    def on_checkpoint(self, path: Path, position: FitPosition) -> None:
        self.saved.append(position)


@pytest.mark.parametrize("how", ["stop", "max_steps"])
async def test_a_stop_on_an_epochs_last_batch_resumes(how: str, tmp_path: Path) -> None:
    ckpt = tmp_path / "c.ckpt"
    async with ActorSystem("fit-run") as system:
        straight = await _trainer(system)
        await fit(straight, (X, Y), epochs=2, batch_size=8, seed=4)
        stop = StopFlag()
        cb = _StopAt(stop, 5 if how == "stop" else -1)
        config = TrainerConfig(CONFIG.optimizer, CONFIG.loss, max_steps=5)
        first = await Trainer.spawn(
            system, Mlp([6, 8, 3], seed=0), "cpu:0", config if how == "max_steps" else CONFIG
        )
        result = await fit(
            first, (X, Y), epochs=2, batch_size=8, seed=4, checkpoint=ckpt, stop=stop,
            callbacks=[cb],
        )  # fmt: skip
        assert result.position == FitPosition(epoch=1, batch=0, step=5)
        assert [r.epoch for r in result.epochs] == [1]  # the epoch was finished first
        second = await _trainer(system, seed=7)
        await second.ask(LoadCheckpoint(str(ckpt)))
        await fit(second, (X, Y), epochs=2, batch_size=8, seed=4, start=result.position)
        np.testing.assert_array_equal(
            await second.ask(GetWeights()), await straight.ask(GetWeights())
        )


class _Flaky:
    """A validation dataset whose reads fail from the `fail_from`-th on."""

    def __init__(self, fail_from: int) -> None:
        self.reads, self.fail_from = 0, fail_from

    def __len__(self) -> int:
        return 8

    def get_batch(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self.reads += 1
        if self.reads >= self.fail_from:
            raise OSError("the share went away")
        return X[idx], Y[idx]


async def test_a_failed_evaluation_keeps_the_epochs_training(tmp_path: Path) -> None:
    ckpt = tmp_path / "c.ckpt"
    async with ActorSystem("fit-run") as system:
        trainer = await _trainer(system)
        saved: list[FitPosition] = []

        class Heard(FitCallback):
            def on_checkpoint(self, path: Path, position: FitPosition) -> None:
                saved.append(position)

        # reads 1 and 2: the source's and fit's probes; 3: after epoch 1; 4: fails after epoch 2
        with pytest.raises(OSError, match="the share went away") as caught:
            await fit(
                trainer, (X, Y), validation=_Flaky(4), epochs=3, batch_size=8, seed=4,
                checkpoint=ckpt, callbacks=[Heard()],
            )  # fmt: skip
        assert saved[-1] == FitPosition(epoch=2, batch=0, step=10)
        assert "evaluating after epoch 2 failed; its training is kept" in "".join(
            caught.value.__notes__
        )
        weights = await trainer.ask(GetWeights())
        again = await _trainer(system, seed=9)
        await again.ask(LoadCheckpoint(str(ckpt)))
        np.testing.assert_array_equal(await again.ask(GetWeights()), weights)


@pytest.mark.parametrize(
    ("start", "error", "needle"),
    [
        ({"epoch": 0}, TypeError, "start must be a FitPosition, got dict"),
        (FitPosition(epoch=-1), ValueError, "start.epoch must be >= 0"),
        (FitPosition(batch=-1), ValueError, "start.batch must be >= 0"),
        (FitPosition(step=-5), ValueError, "start.step must be >= 0"),
        (FitPosition(batch=1.5), TypeError, "start.batch must be an int"),  # type: ignore[arg-type]
    ],
)
async def test_a_start_that_does_not_fit_is_refused_before_any_step(
    start: Any, error: type[Exception], needle: str
) -> None:
    async with ActorSystem("fit-run") as system:
        trainer = await _trainer(system)
        before = await trainer.ask(GetWeights())
        with pytest.raises(error, match=needle):
            await fit(trainer, (X, Y), epochs=2, batch_size=8, start=start)
        np.testing.assert_array_equal(await trainer.ask(GetWeights()), before)


async def test_a_checkpoint_that_cannot_be_written_is_refused_before_any_step(
    tmp_path: Path,
) -> None:
    async with ActorSystem("fit-run") as system:
        trainer = await _trainer(system)
        before = await trainer.ask(GetWeights())
        with pytest.raises(FileNotFoundError):
            await fit(trainer, (X, Y), epochs=1, batch_size=8, checkpoint=tmp_path / "no" / "c")
        with pytest.raises(Exception, match="not a regular file"):
            await fit(trainer, (X, Y), epochs=1, batch_size=8, checkpoint=tmp_path)
        np.testing.assert_array_equal(await trainer.ask(GetWeights()), before)


async def test_one_fit_per_trainer_at_a_time() -> None:
    async with ActorSystem("fit-run") as system:
        trainer = await _trainer(system)
        first = asyncio.ensure_future(fit(trainer, (X, Y), epochs=3, batch_size=8))
        await asyncio.sleep(0)  # the first has registered the trainer
        with pytest.raises(RuntimeError, match="fit is already training this trainer"):
            await fit(trainer, (X, Y), epochs=1, batch_size=8)
        assert (await first).position.step == 15  # undisturbed
        assert (await fit(trainer, (X, Y), epochs=1, batch_size=8)).status == "finished"


class _CancelAt(FitCallback):
    """Cancels `task` (the `fit` being run) when step `step` is counted."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.task: asyncio.Future[Any] | None = None

    def on_step(self, position: FitPosition, *_: Any) -> None:
        if position.step == self.step and self.task is not None:
            self.task.cancel()


async def test_a_cancelled_fit_leaves_the_trainer_consistent_and_free(tmp_path: Path) -> None:
    """docs/training.md: cancelling `fit` saves nothing; the trainer applies
    what it was sent, its weights are those of the steps it counts, and
    another `fit` may train it at once."""
    ckpt = tmp_path / "c.ckpt"
    async with ActorSystem("fit-run") as system:
        trainer = await _trainer(system)
        cancel = _CancelAt(3)
        run = asyncio.ensure_future(
            fit(
                trainer, (X, Y), epochs=3, batch_size=8, seed=4, checkpoint=ckpt, callbacks=[cancel]
            )
        )
        cancel.task = run
        with pytest.raises(asyncio.CancelledError):
            await run
        assert not ckpt.exists()
        steps = (await trainer.ask(GetTrainingState())).step
        assert steps in (3, 4)  # 4: the Step sent as the cancellation came
        config = TrainerConfig(CONFIG.optimizer, CONFIG.loss, max_steps=steps)
        reference = await Trainer.spawn(system, Mlp([6, 8, 3], seed=0), "cpu:0", config)
        await fit(reference, (X, Y), epochs=1, batch_size=8, seed=4)
        np.testing.assert_array_equal(
            await trainer.ask(GetWeights()), await reference.ask(GetWeights())
        )
        assert (await fit(trainer, (X, Y), epochs=1, batch_size=8)).status == "finished"


class _LyingBatches:
    def __init__(self, length: Any, reply: Any = None) -> None:
        self.length, self.reply = length, reply

    def __len__(self) -> Any:
        return self.length

    def get_batch(self, idx: np.ndarray) -> Any:
        return self.reply if self.reply is not None else (X[idx], Y[idx])


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (_LyingBatches(41), "get_batch of samples up to 40 failed although len"),
        (_LyingBatches(40, reply="oops"), "get_batch must return a \\(features, labels\\) pair"),
        (_LyingBatches(-1), "train: len\\(dataset\\) failed"),
        (_LyingBatches(40.0), "train: len\\(dataset\\) failed"),
        ([], "train: epoch 0 has no batches"),
        (lambda epoch: [], "train: epoch 0 has no batches"),
    ],
)
async def test_bad_data_is_named_before_any_step(data: Any, needle: str) -> None:
    async with ActorSystem("fit-run") as system:
        trainer = await _trainer(system)
        before = await trainer.ask(GetWeights())
        with pytest.raises(InvalidDataError, match=needle):
            await fit(trainer, data, epochs=1, batch_size=8)
        np.testing.assert_array_equal(await trainer.ask(GetWeights()), before)


async def test_a_resume_past_a_streamed_epochs_end_is_refused() -> None:
    batches = [(X[i : i + 8], Y[i : i + 8]) for i in range(0, 40, 8)]
    async with ActorSystem("fit-run") as system:
        trainer = await _trainer(system)
        with pytest.raises(InvalidDataError, match="resume position \\(batch 9\\) is past"):
            await fit(trainer, batches, epochs=2, batch_size=8, start=FitPosition(batch=9))
        result = await fit(trainer, batches, epochs=2, batch_size=8, start=FitPosition(batch=5))
        assert result.position == FitPosition(epoch=2, batch=0, step=5)  # epoch 1 was done


async def test_a_source_error_without_a_checkpoint_does_not_mention_one() -> None:
    def broken(epoch: int) -> Any:
        yield X[:8], Y[:8]
        raise OSError("gone")

    async with ActorSystem("fit-run") as system:
        trainer = await _trainer(system)
        with pytest.raises(DataSourceError) as caught:
            await fit(trainer, broken, epochs=1, batch_size=8)
        assert "checkpoint" not in str(caught.value)


class _FailsAt(FitCallback):
    """Fails at `hook` (at `on_step`: of step `step`) as a log on a full disk does."""

    def __init__(self, hook: str, step: int = 0) -> None:
        self.hook, self.step = hook, step

    def _fail(self, hook: str, step: int = 0) -> None:
        if hook == self.hook and step == self.step:
            raise OSError(28, "No space left on device")

    def on_epoch_start(self, epoch: int, epochs: int) -> None:
        self._fail("on_epoch_start")

    def on_step(self, position: FitPosition, *_: Any) -> None:
        self._fail("on_step", position.step)

    def on_evaluate(self, *_: Any) -> None:
        self._fail("on_evaluate")

    def on_epoch_end(self, *_: Any) -> None:
        self._fail("on_epoch_end")

    def on_checkpoint(self, *_: Any) -> None:
        self._fail("on_checkpoint")


@pytest.mark.parametrize(
    ("hook", "step", "saved"),
    [
        ("on_step", 3, FitPosition(epoch=0, batch=3, step=3)),
        ("on_step", 5, FitPosition(epoch=1, batch=0, step=5)),  # the epoch's last batch
        ("on_evaluate", 0, FitPosition(epoch=1, batch=0, step=5)),
        ("on_epoch_end", 0, FitPosition(epoch=1, batch=0, step=5)),
        ("on_checkpoint", 0, FitPosition(epoch=1, batch=0, step=5)),  # saved once, not again
    ],
)
async def test_a_failing_callback_saves_the_checkpoint_where_the_run_stands(
    hook: str, step: int, saved: FitPosition, tmp_path: Path
) -> None:
    """A callback's error ended the run with nothing saved since the last
    epoch: a full disk under the metrics log lost the training."""
    ckpt = tmp_path / "c.ckpt"
    async with ActorSystem("fit-run") as system:
        straight = await _trainer(system)
        await fit(straight, (X, Y), epochs=2, batch_size=8, seed=4)
        heard = _StopAt(StopFlag(), -1)
        with pytest.raises(OSError, match="No space left") as caught:
            await fit(
                await _trainer(system), (X, Y), epochs=2, batch_size=8, seed=4,
                checkpoint=ckpt, callbacks=[heard, _FailsAt(hook, step)],
            )  # fmt: skip
        assert heard.saved == [saved]
        note = "".join(caught.value.__notes__)
        assert f"the callback _FailsAt.{hook} raised after step {saved.step}" in note
        assert f"holds the {saved.step} steps trained, to resume at epoch {saved.epoch + 1}" in note
        second = await _trainer(system, seed=7)
        await second.ask(LoadCheckpoint(str(ckpt)))
        await fit(second, (X, Y), epochs=2, batch_size=8, seed=4, start=saved)
        np.testing.assert_array_equal(
            await second.ask(GetWeights()), await straight.ask(GetWeights())
        )


class _Hears(FitCallback):
    """Records what it hears; raises at `fail_at` (a hook, or "on_step N")."""

    def __init__(self, fail_at: str = "") -> None:
        self.fail_at, self.heard = fail_at, []  # type: ignore[var-annotated]

    def _hear(self, event: str) -> None:
        self.heard.append(event)
        if event == self.fail_at:
            raise OSError(28, f"No space left on device ({event})")

    def on_step(self, position: FitPosition, *_: Any) -> None:
        self._hear(f"on_step {position.step}")

    def on_evaluate(self, split: str, *_: Any) -> None:
        self._hear(f"on_evaluate {split}")

    def on_epoch_end(self, record: Any, epochs: int) -> None:
        self._hear(f"on_epoch_end {record.epoch}")

    def on_checkpoint(self, path: Path, position: FitPosition) -> None:
        self._hear(f"on_checkpoint {position.epoch} {position.batch} {position.step}")


_EPOCH_END = ["on_evaluate train", "on_evaluate validation", "on_epoch_end 1"]


@pytest.mark.parametrize("failing_first", [True, False])
@pytest.mark.parametrize("fail_at", ["on_evaluate train", "on_step 5"])
async def test_the_other_callbacks_hear_the_rest_of_the_epoch_and_the_save(
    fail_at: str, failing_first: bool, tmp_path: Path
) -> None:
    """A callback raising in on_evaluate kept the ones after it from hearing
    the epoch's end: the CLI's history lost the epoch its checkpoint was
    saved after. A failure on an epoch's last step now finishes the epoch as
    a stop does; the callback that raised hears nothing more."""
    failing, other = _Hears(fail_at), _Hears()
    callbacks = [failing, other] if failing_first else [other, failing]
    async with ActorSystem("fit-run") as system:
        with pytest.raises(OSError, match=fail_at) as caught:
            await fit(
                await _trainer(system), (X, Y), validation=(X, Y), epochs=2, batch_size=8,
                checkpoint=tmp_path / "c.ckpt", callbacks=callbacks,
            )  # fmt: skip
    steps = [f"on_step {step}" for step in range(1, 6)]
    assert other.heard == [*steps, *_EPOCH_END, "on_checkpoint 1 0 5"]
    assert failing.heard[-1] == fail_at  # nothing after its failure
    note = "".join(caught.value.__notes__)
    assert f"the callback _Hears.{fail_at.split()[0]} raised after step 5" in note
    assert "holds the 5 steps trained, to resume at epoch 2, batch 0" in note


async def test_a_second_failing_callback_is_named_in_a_note(tmp_path: Path) -> None:
    first, second, other = _Hears("on_evaluate train"), _Hears("on_epoch_end 1"), _Hears()
    async with ActorSystem("fit-run") as system:
        with pytest.raises(OSError, match="on_evaluate train") as caught:
            await fit(
                await _trainer(system), (X, Y), validation=(X, Y), epochs=2, batch_size=8,
                checkpoint=tmp_path / "c.ckpt", callbacks=[first, second, other],
            )  # fmt: skip
    assert other.heard[-4:] == [*_EPOCH_END, "on_checkpoint 1 0 5"]
    assert second.heard[-1] == "on_epoch_end 1"
    notes = caught.value.__notes__
    assert any("the callback _Hears.on_evaluate raised after step 5" in n for n in notes)
    assert any("the callback _Hears.on_epoch_end raised too, after step 5" in n for n in notes)


@pytest.mark.parametrize("given", [0, 3, 9])
async def test_the_step_count_is_the_trainers_whatever_start_step_says(given: int) -> None:
    """`start.step` used to be taken as it was: a wrong one shifted every
    logged step number and the max_steps check (step 9 of a trainer at 3
    with max_steps 5 stopped before any step; step 0 ran one step past the
    count). The trainer's own count (`GetTrainingState`) is the run's."""
    config = TrainerConfig(CONFIG.optimizer, CONFIG.loss, max_steps=5)
    async with ActorSystem("fit-run") as system:
        trainer = await Trainer.spawn(system, Mlp([6, 8, 3], seed=0), "cpu:0", config)
        await fit(trainer, (X[:24], Y[:24]), epochs=1, batch_size=8)  # 3 steps
        steps: list[int] = []
        cb = FitCallback()
        cb.on_step = lambda position, *_: steps.append(position.step)  # type: ignore[method-assign]
        start = FitPosition(epoch=1, batch=0, step=given)
        result = await fit(trainer, (X, Y), epochs=2, batch_size=8, start=start, callbacks=[cb])
        assert (result.status, steps) == ("reached max_steps", [4, 5])
        assert result.position == FitPosition(epoch=1, batch=2, step=5)
        assert (await trainer.ask(GetTrainingState())).step == 5
