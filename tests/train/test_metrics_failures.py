"""The metrics logs when writing fails (a full disk, simulated: no root
needed) or after they are closed: they raise, naming what they write, and
never block."""

from __future__ import annotations

import errno
import json
import types
from pathlib import Path

import numpy as np
import pytest

from atomr.testkit import wait_until
from atomr.train import metrics
from atomr.train.core.stats import StepStats
from atomr.train.fit import EpochRecord, FitPosition
from atomr.train.metrics import JsonLinesLog, TensorBoardLog
from tests.train.full_disk import (
    Stuck,
    json_lines_fill_after,
    tensorboard_fills_after,
    tensorboard_stuck,
    within,
    writer_thread,
)
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


def _stuck_tensorboard_log(
    logdir: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[TensorBoardLog, Stuck]:
    """A log with a queue of 20 events whose writer thread will be stuck in
    its next write (`Stuck`), and a timeout of 0.2 s."""
    pytest.importorskip("tensorboardX", reason="tensorboardX (atomr[tensorboard]) not installed")
    monkeypatch.setattr(metrics, "QUEUE", 20)
    log = TensorBoardLog(logdir, timeout=0.2)
    return log, tensorboard_stuck(monkeypatch, log)


def _is_stuck_error(error: BaseException | None, logdir: Path) -> bool:
    return (
        isinstance(error, TimeoutError)
        and error.filename == str(logdir)
        and "the TensorBoard writer is stuck" in str(error)
    )


def test_a_write_to_a_stuck_tensorboard_writer_ends_with_a_timeout_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once its queue was full, add_scalar waited for a stuck thread for ever."""
    log, stuck = _stuck_tensorboard_log(tmp_path / "tb", monkeypatch)

    def steps() -> None:
        for step in range(1, 50):  # 5 events a step: the queue of 20 fills
            log.on_step(FitPosition(0, step, step), STATS, 0.5, 1.0)

    try:
        error = within(30, steps)
    finally:
        stuck.release.set()
    assert _is_stuck_error(error, tmp_path / "tb"), error
    log.close()  # the thread wrote on: it closes


@pytest.mark.parametrize("wait", ["close", "on_epoch_end"])
def test_closing_or_flushing_a_stuck_tensorboard_writer_ends_with_a_timeout_error(
    wait: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """close() and the epoch's flush waited for a stuck thread for ever."""
    log, stuck = _stuck_tensorboard_log(tmp_path / "tb", monkeypatch)
    log.on_step(FitPosition(0, 1, 1), STATS, 0.5, 1.0)
    wait_until(stuck.entered.is_set, timeout=10)  # its thread is stuck writing it
    record = EpochRecord(1, 1, 0.5, 0.9, 0.5, 0.9, 10.0, 1.0)
    call = log.close if wait == "close" else lambda: log.on_epoch_end(record, 1)
    try:
        error = within(30, call)
    finally:
        stuck.release.set()
    assert _is_stuck_error(error, tmp_path / "tb"), error
    log.close()  # again, or at last: nothing waits for ever


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


def _steps(path: Path) -> list[int | None]:
    """The step of each line of a JSON Lines file; None for a line that is not JSON."""
    steps: list[int | None] = []
    for line in path.read_text().splitlines():
        try:
            steps.append(json.loads(line)["step"])
        except ValueError:
            steps.append(None)
    return steps


def test_a_json_lines_write_on_a_full_disk_names_the_file_and_the_next_starts_a_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The error named no file, and the next event would be glued onto the cut line."""
    path = tmp_path / "m.jsonl"
    disk = json_lines_fill_after(monkeypatch, 250)  # one step's line and part of the next
    log = JsonLinesLog(path)
    with pytest.raises(OSError) as caught:
        for step in range(1, 5):
            log.on_step(FitPosition(0, step, step), STATS, 0.5, 1.0)
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(path)
    disk[0].room = 10**6  # room again
    log.on_step(FitPosition(0, 9, 9), STATS, 0.5, 1.0)
    log.close()
    assert _steps(path) == [1, None, 9]


def test_a_json_lines_log_appends_after_a_cut_line_on_a_new_line(tmp_path: Path) -> None:
    """Its first event was glued onto the cut line: both were lost to a reader."""
    path = tmp_path / "m.jsonl"
    path.write_text('{"event": "step", "step": 1}\n{"event": "step", "st')  # a crash mid-write
    for step in (2, 3):  # the second log appends to a whole line: no blank line
        with JsonLinesLog(path) as log:
            log.on_step(FitPosition(0, step, step), STATS, 0.5, 1.0)
    assert _steps(path) == [1, None, 2, 3]


@pytest.mark.parametrize(
    ("timeout", "error"),
    [
        (None, TypeError),
        ("1", TypeError),
        (0, ValueError),
        (-1.0, ValueError),
        (float("inf"), ValueError),  # was taken: a stuck writer waited on for ever
    ],
)
def test_a_tensorboard_log_refuses_a_bad_timeout_before_making_a_file(
    timeout: object, error: type[Exception], tmp_path: Path
) -> None:
    """The message offers no None, which the log refuses (it said '> 0
    seconds or None')."""
    pytest.importorskip("tensorboardX", reason="tensorboardX (atomr[tensorboard]) not installed")
    with pytest.raises(error, match="timeout must be .*seconds, got") as caught:
        TensorBoardLog(tmp_path / "tb", timeout=timeout)  # type: ignore[arg-type]
    assert "None" not in str(caught.value).split(", got")[0]
    assert not (tmp_path / "tb").exists()


def test_a_tensorboard_log_takes_a_numpy_timeout_as_seconds(tmp_path: Path) -> None:
    """`np.float32(5)` was a TypeError ('must be a number of seconds')."""
    pytest.importorskip("tensorboardX", reason="tensorboardX (atomr[tensorboard]) not installed")
    with TensorBoardLog(tmp_path / "tb", timeout=np.float32(5)) as log:  # type: ignore[arg-type]
        assert log.timeout == 5.0 and type(log.timeout) is float
