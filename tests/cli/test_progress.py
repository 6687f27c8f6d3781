"""The `atomr train` progress bar: what its postfix shows, and when."""

from __future__ import annotations

import tqdm  # noqa: F401  (in the test extra: the bar must exist, not be skipped)

from atomr.cli.progress import Progress
from atomr.train import StepStats
from atomr.train.fit import EpochRecord, FitPosition


def _postfix(progress: Progress) -> str:
    bar = progress._bar
    assert bar is not None
    return str(bar.postfix)


def test_accuracy_appears_once_the_first_epoch_has_ended(capsys) -> None:
    progress = Progress(total_steps=4)
    stats = StepStats(loss=2.0, grad_norm=1.0, step_micros=10, samples=8)
    progress.on_epoch_start(1, 2)
    progress.on_step(FitPosition(), stats, mean_loss=2.0, samples_per_s=1000.0)
    assert "loss=2.0000" in _postfix(progress)
    assert "acc" not in _postfix(progress)  # no "acc=nan" before any evaluation
    record = EpochRecord(1, 2, 1.5, 0.5, 1.4, 0.875, 1000.0, 0.1)
    progress.on_epoch_end(record, 2)
    progress.on_step(FitPosition(), stats, mean_loss=1.2, samples_per_s=900.0)
    assert "acc=0.875" in _postfix(progress)
    assert "samples_s=900" in _postfix(progress)
    progress.close()
    err = capsys.readouterr().err
    assert "epoch 1/2: train loss 1.5000, test loss 1.4000, test accuracy 0.8750" in err


def test_quiet_progress_prints_nothing(capsys) -> None:
    progress = Progress(total_steps=2, enabled=False)
    progress.on_step(FitPosition(), StepStats(1.0, 1.0, 1, 4), mean_loss=1.0, samples_per_s=1.0)
    progress.on_epoch_end(EpochRecord(1, 1, 1.0, 0.5, 1.0, 0.5, 1.0, 0.1), 1)
    progress.close()
    assert capsys.readouterr().err == ""


def test_the_bar_shows_the_last_epochs_accuracy_once_it_ends(capsys) -> None:
    progress = Progress(total_steps=2)
    stats = StepStats(loss=2.0, grad_norm=1.0, step_micros=10, samples=8)
    progress.on_step(FitPosition(), stats, mean_loss=2.0, samples_per_s=1000.0)
    progress.on_epoch_end(EpochRecord(1, 1, 1.5, 0.5, 1.4, 0.875, 1000.0, 0.1), 2)
    progress.on_step(FitPosition(), stats, mean_loss=1.2, samples_per_s=900.0)
    # the final epoch ends: no further update, the bar must still show its accuracy
    progress.on_epoch_end(EpochRecord(2, 2, 1.1, 0.6, 1.0, 0.9375, 900.0, 0.1), 2)
    assert _postfix(progress) == "loss=1.2000, acc=0.938, samples_s=900"
    progress.close()
    capsys.readouterr()
