"""The metrics logs when writing fails (a full disk, simulated: no root
needed) or after they are closed: they raise, naming what they write, and
never block."""

from __future__ import annotations

from pathlib import Path

import pytest

from atomr.testkit import wait_until
from atomr.train.core.stats import StepStats
from atomr.train.fit import FitPosition
from atomr.train.metrics import TensorBoardLog
from tests.train.full_disk import tensorboard_fills_after, within, writer_thread

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
