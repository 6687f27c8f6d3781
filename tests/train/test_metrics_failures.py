"""The metrics logs when writing fails (a full disk, simulated: no root
needed) or after they are closed: they raise, naming what they write, and
never block."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from atomr.testkit import wait_until
from atomr.train.core.stats import StepStats
from atomr.train.fit import EpochRecord, FitPosition
from atomr.train.metrics import TensorBoardLog
from tests.train.full_disk import tensorboard_fills_after, within, writer_thread
from tests.train.test_metrics import _read_events

STATS = StepStats(0.5, 1.0, 10, 4)


def _dead_tensorboard_log(logdir: Path, monkeypatch: pytest.MonkeyPatch) -> TensorBoardLog:
    """A log whose writer thread died of a full disk on its first event."""
    pytest.importorskip("tensorboardX", reason="tensorboardX (atomr[tensorboard]) not installed")
    log = TensorBoardLog(logdir)
    died = tensorboard_fills_after(monkeypatch, 0)
    log.on_step(FitPosition(0, 1, 1), STATS, 0.5, 1.0)
    thread = writer_thread(log)
    wait_until(lambda: died and not thread.is_alive(), timeout=10)
    return log


def test_a_write_after_the_tensorboard_writer_died_raises_naming_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It blocked the event loop for good once tensorboardX's queue was full."""
    log = _dead_tensorboard_log(tmp_path / "tb", monkeypatch)

    def steps() -> None:
        for step in range(2, 6):
            log.on_step(FitPosition(0, step, step), STATS, 0.5, 1.0)

    error = within(10, steps)
    assert isinstance(error, OSError), error
    assert error.filename == str(tmp_path / "tb") and "TensorBoard writer stopped" in str(error)


def test_closing_a_tensorboard_log_whose_writer_died_does_not_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its close put a stop signal on the full queue of a thread that was gone."""
    log = _dead_tensorboard_log(tmp_path / "tb", monkeypatch)
    for step in range(10):  # events queued after the thread died, before it was seen
        log._writer.add_scalar("step/loss", 0.5, step)
    error = within(10, log.close)
    assert isinstance(error, OSError) and error.filename == str(tmp_path / "tb"), error


def test_a_tensorboard_log_refuses_events_after_close_and_keeps_its_file(tmp_path: Path) -> None:
    """tensorboardX took them into a new event file, which within the same
    second is the old one opened anew: the curve written before was gone."""
    pytest.importorskip("tensorboardX", reason="tensorboardX (atomr[tensorboard]) not installed")
    log = TensorBoardLog(tmp_path)
    for step in (1, 2, 3):
        log.on_step(FitPosition(0, step, step), STATS, 0.5, 1.0)
    log.close()
    late = (
        lambda: log.on_step(FitPosition(0, 4, 4), STATS, 0.5, 1.0),
        lambda: log.on_evaluate("train", 0.5, 0.9, FitPosition(1, 0, 4)),
        lambda: log.on_epoch_end(EpochRecord(1, 4, 0.5, 0.9, 0.5, 0.9, 10.0, 1.0), 1),
    )
    for event in late:
        with pytest.raises(ValueError, match="the log is closed"):
            event()
    log.close()  # again: nothing to do
    assert [s for s, _ in _read_events(tmp_path)["step/loss"]] == [1, 2, 3]


def test_two_tensorboard_logs_in_one_folder_in_one_second_keep_both_curves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tensorboardX names an event file by the second and the host: the
    second log's file was the first's, opened anew."""
    event_file_writer = pytest.importorskip(
        "tensorboardX.event_file_writer", reason="tensorboardX (atomr[tensorboard]) not installed"
    )
    second = types.SimpleNamespace(time=lambda: 1_700_000_000.0)
    monkeypatch.setattr(event_file_writer, "time", second)
    for steps in ((1, 2, 3), (4, 5)):
        with TensorBoardLog(tmp_path) as log:
            for step in steps:
                log.on_step(FitPosition(0, step, step), STATS, 0.5, 1.0)
    assert sorted(s for s, _ in _read_events(tmp_path)["step/loss"]) == [1, 2, 3, 4, 5]
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 2
