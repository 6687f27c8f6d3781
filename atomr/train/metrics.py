"""Metrics logs for `fit`: JSON Lines, and TensorBoard event files.

Both are `FitCallback`s: pass them in `fit(..., callbacks=[...])` (`atomr
train` does with `--metrics PATH` and `--tensorboard DIR`). Each step logs
its loss, gradient norm, samples, the epoch's throughput so far (samples/s,
wall time of the steps) and the share of the step spent reducing gradients
across workers (`StepStats.comm_micros / step_micros`: the data-parallel
all-reduce; 0 on one device); each evaluation its loss and accuracy; each
epoch its `EpochRecord`.

TensorBoard files are written through `tensorboardX` (the `atomr[tensorboard]`
extra), so `tensorboard --logdir DIR` shows the curves.

An `OSError` a log raises names what it writes (its `filename`: the JSON
Lines file, or the TensorBoard folder).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import uuid
from collections.abc import Iterator
from io import FileIO
from pathlib import Path
from typing import Any, Self

import numpy as np

from atomr.actor.ref import check_timeout
from atomr.train._tensorboard_writer import (
    QUEUE,
    call_while_writing,
    close_writer,
    give_up,
    stopped_error,
    stuck_error,
    wait_for_room,
)
from atomr.train.core.stats import StepStats
from atomr.train.fit import EpochRecord, FitCallback, FitPosition

__all__ = ["JsonLinesLog", "TensorBoardLog", "json_value", "step_metrics", "summary_writer_class"]


def step_metrics(stats: StepStats, rate: float) -> dict[str, float]:
    """The figures of one step: loss, gradient norm, samples, samples/s (the
    epoch's so far) and the gradient-reduction share of the step's time."""
    share = stats.comm_micros / stats.step_micros if stats.step_micros > 0 else 0.0
    return {
        "loss": stats.loss,
        "grad_norm": stats.grad_norm,
        "samples": float(stats.samples),
        "samples_per_s": rate,
        "allreduce_share": share,
    }


def json_value(value: Any) -> Any:
    """`value` as JSON takes it: a NumPy scalar as the Python bool, int or
    float it is (a trainer of one's own may answer them), and None for a
    NaN or infinite float (JSON has none)."""
    if isinstance(value, np.bool_ | np.number):
        value = value.item()
    return None if isinstance(value, float) and not math.isfinite(value) else value


class _Log(FitCallback):
    """What both logs share: an `OSError` names what they write (`_target`),
    and a `with` block closes them."""

    _target: Path

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """Around a write.

        Raises:
            OSError: what the write raised, its `filename` set to `_target`.
        """
        try:
            yield
        except OSError as exc:
            exc.filename = str(self._target)
            raise

    def _closed(self) -> ValueError:
        """The error of an event after `close`."""
        return ValueError(f"{self._target}: the log is closed")

    def close(self) -> None:
        """Close the log (each log says what it raises)."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        """Close the log. Leaving on an exception, a failure to close is
        added to it as a note (the exception in flight is the one raised),
        unless it is about this log already.

        Raises:
            OSError: closing failed (leaving the block normally).
        """
        if exc is None:
            self.close()
            return
        try:
            self.close()
        except OSError as failed:
            if getattr(exc, "filename", None) != failed.filename:
                exc.add_note(f"closing {self._target} failed too: {failed}")


def _ends_mid_line(path: Path) -> bool:
    """Whether the file at `path` ends in a line without its newline (a write
    cut short: a full disk, a crash); False when empty or not a regular file.

    Raises:
        OSError: the file cannot be read.
    """
    if not path.is_file():
        return False
    with open(path, "rb") as file:
        end = file.seek(0, os.SEEK_END)
        if end == 0:
            return False
        file.seek(end - 1)
        return file.read(1) != b"\n"


class JsonLinesLog(_Log):
    """One JSON object per line: `{"event": "step" | "evaluate" | "epoch", ...}`.

    A `step` event holds the `FitPosition` after it (`epoch`: the 0-based
    epoch in progress), its figures and `applied` (False for an
    accumulation window's micro-steps); `evaluate` and `epoch` events hold
    the 1-based number of the epoch just finished. A NaN or infinite figure
    is written as null (JSON has neither).

    Each event is one unbuffered write: a write that fails (a full disk)
    leaves nothing behind to be written later, and the next event, here or
    in a log that appends to the file later, starts on a new line, so that
    only the line that was cut is lost.

    Args:
        path: the file (appended to; its folder is made).

    Raises:
        OSError: the file cannot be opened (when made).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = self._target = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._cut = _ends_mid_line(self.path)  # the next line starts with a newline
        self._file: FileIO | None = open(self.path, "ab", buffering=0)  # noqa: SIM115

    def _write(self, record: dict[str, Any]) -> None:
        """Append `record` as a line of its own (a NaN or infinite figure as null).

        Raises:
            ValueError: the log is closed.
            OSError: the write failed (naming `path`).
        """
        if self._file is None:
            raise self._closed()
        text = json.dumps({k: json_value(v) for k, v in record.items()}, allow_nan=False)
        line = (b"\n" if self._cut else b"") + text.encode() + b"\n"
        written = 0
        with self._writing():
            try:
                while written < len(line):
                    written += self._file.write(line[written:])
            finally:
                if written:
                    self._cut = line[written - 1 : written] != b"\n"

    def on_step(
        self, position: FitPosition, stats: StepStats, mean_loss: float, rate: float
    ) -> None:
        """Log the step (see `step_metrics`).

        Raises:
            ValueError: the log is closed.
            OSError: the write failed (naming `path`).
        """
        figures = step_metrics(stats, rate)
        self._write({"event": "step", **vars(position), **figures, "applied": stats.applied})

    def on_evaluate(self, split: str, loss: float, accuracy: float, position: FitPosition) -> None:
        """Log an evaluation (`epoch`: the 1-based number of the epoch just
        finished, as in its `epoch` event).

        Raises:
            ValueError: the log is closed.
            OSError: the write failed (naming `path`).
        """
        self._write(
            {
                "event": "evaluate",
                "split": split,
                "step": position.step,
                "epoch": position.epoch + 1,
                "loss": loss,
                "accuracy": accuracy,
            }
        )

    def on_epoch_end(self, record: EpochRecord, epochs: int) -> None:
        """Log the epoch's record.

        Raises:
            ValueError: the log is closed.
            OSError: the write failed (naming `path`).
        """
        figures = {k: v for k, v in vars(record).items() if isinstance(v, float)}
        self._write({"event": "epoch", "epoch": record.epoch, "step": record.step, **figures})

    def close(self) -> None:
        """Close the file (later events raise ValueError)."""
        if self._file is not None:
            self._file.close()
            self._file = None


def summary_writer_class() -> Any:
    """tensorboardX's `SummaryWriter`, which `TensorBoardLog` writes with
    (`atomr train` asks for it before any file is written).

    Raises:
        ImportError: tensorboardX is not installed (`pip install -e '.[tensorboard]'`).
    """
    try:
        from tensorboardX import SummaryWriter  # noqa: PLC0415 - an optional extra
    except ImportError as exc:
        raise ImportError(
            f"TensorBoard logs need tensorboardX: pip install -e '.[tensorboard]' ({exc})"
        ) from exc
    return SummaryWriter


class TensorBoardLog(_Log):
    """TensorBoard scalars: `step/*` at every step, `<split>/loss` and
    `<split>/accuracy` at every evaluation, `epoch/*` at every epoch end,
    indexed by the optimizer step.

    Each log writes an event file of its own (a random suffix after
    tensorboardX's name, which holds the time only to the second), so two
    logs in one folder never write over each other.

    tensorboardX writes the file from a thread of its own. A log never waits
    on that thread without a deadline: a write waiting for room in its queue,
    the flush at an epoch's end and `close` wait while the thread writes,
    and raise `TimeoutError` once it has taken no event for `timeout`
    seconds (a thread stuck in a write: a hung network file system).

    Args:
        logdir: the folder of the event files.
        timeout: seconds without an event written after which the writer's
            thread counts as stuck.

    Raises:
        ImportError: tensorboardX is not installed (`pip install -e '.[tensorboard]'`).
        TypeError, ValueError: `timeout` is not a finite number of seconds
            > 0 (an infinite one would wait on a stuck thread for ever).
    """

    def __init__(self, logdir: str | Path, *, timeout: float = 60.0) -> None:
        seconds = check_timeout(timeout, optional=False, finite=True)
        assert seconds is not None  # not optional
        self.timeout = seconds
        writer_class = summary_writer_class()
        self.logdir = self._target = Path(logdir)
        self._writer: Any | None = writer_class(
            logdir=str(self.logdir), max_queue=QUEUE, filename_suffix=f".{uuid.uuid4().hex}"
        )

    def _live(self, events: int) -> Any:
        """The writer, checked before a write of `events` events: its thread
        alive, with room in its queue (waited for while the thread writes).

        Raises:
            ValueError: the log is closed (tensorboardX would start a new
                event file, which within the same second is the old one,
                truncated).
            OSError: the thread stopped (`stopped_error`).
            TimeoutError: no room, and the thread wrote nothing for
                `timeout` seconds.
        """
        if self._writer is None:
            raise self._closed()
        writer = self._writer
        if not wait_for_room(writer, events, self.timeout):
            raise self._stuck_error(writer, "these events and those after were not written")
        stopped = stopped_error(writer, self.logdir)
        if stopped is not None:
            raise stopped
        return writer

    def _stuck_error(self, writer: Any, what: str) -> TimeoutError:
        return stuck_error(writer, self.logdir, self.timeout, what)

    def on_step(
        self, position: FitPosition, stats: StepStats, mean_loss: float, rate: float
    ) -> None:
        """Log the step's figures (see `step_metrics`), one point per optimizer
        step: an accumulation window's micro-steps that applied nothing are
        left out (their loss is in the window's last step, and they have no
        gradient norm).

        Raises:
            ValueError: the log is closed.
            OSError: the writer's thread stopped, or a write failed (naming
                `logdir`).
            TimeoutError: the writer's thread is stuck (no room in its
                queue, and no event written for `timeout` seconds).
        """
        if not stats.applied:
            return
        figures = step_metrics(stats, rate)
        writer = self._live(len(figures))
        with self._writing():
            for name, value in figures.items():
                writer.add_scalar(f"step/{name}", value, position.step)

    def on_evaluate(self, split: str, loss: float, accuracy: float, position: FitPosition) -> None:
        """Log an evaluation's loss and accuracy (NaN ones are skipped).

        Raises:
            ValueError: the log is closed.
            OSError: the writer's thread stopped, or a write failed (naming
                `logdir`).
            TimeoutError: the writer's thread is stuck (no room in its
                queue, and no event written for `timeout` seconds).
        """
        figures = [
            (name, v) for name, v in (("loss", loss), ("accuracy", accuracy)) if math.isfinite(v)
        ]
        writer = self._live(len(figures))
        with self._writing():
            for name, value in figures:
                writer.add_scalar(f"{split}/{name}", value, position.step)

    def on_epoch_end(self, record: EpochRecord, epochs: int) -> None:
        """Log the epoch's record, and flush the event file.

        Raises:
            ValueError: the log is closed.
            OSError: the writer's thread stopped, or a write failed (naming
                `logdir`).
            TimeoutError: the writer's thread is stuck (no room in its
                queue, or a flush it did not let finish, and no event
                written for `timeout` seconds).
        """
        figures = [
            (name, value)
            for name, value in vars(record).items()
            if isinstance(value, float) and math.isfinite(value)
        ]
        writer = self._live(len(figures))
        with self._writing():
            for name, value in figures:
                writer.add_scalar(f"epoch/{name}", value, record.step)
            if not call_while_writing(writer, writer.flush, self.timeout):
                raise self._stuck_error(writer, "the epoch's events may not be on disk")

    def close(self) -> None:
        """Flush and close the event file (later events raise ValueError;
        closing again does nothing); a writer whose thread stopped is closed
        without waiting for it, and one whose thread is stuck is given up on
        once it wrote nothing for `timeout` seconds (tensorboardX's exit
        handler does not try again).

        Raises:
            OSError: the last events could not be written (the thread
                stopped, or the flush failed).
            TimeoutError: the writer's thread is stuck (see above); the
                last events may not be written.
        """
        writer, self._writer = self._writer, None
        if writer is None:
            return
        stopped = stopped_error(writer, self.logdir)
        try:
            with self._writing():
                if not call_while_writing(writer, lambda: close_writer(writer), self.timeout):
                    raise self._stuck_error(writer, "the last events may not be written")
        except OSError as failed:
            give_up(writer)
            if stopped is None:
                raise
            raise stopped from failed
        if stopped is not None:
            raise stopped
