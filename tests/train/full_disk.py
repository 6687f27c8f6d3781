"""A full disk, without root: the metrics logs' writes fail with ENOSPC; and
a hung one: tensorboardX's writer thread stuck in a write."""

from __future__ import annotations

import errno
import itertools
import os
import threading
from collections.abc import Callable
from typing import Any

import pytest

ENOSPC = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class Filling:
    """A file with `room` bytes left on its disk: the write that reaches the
    limit is cut short, the next fails with ENOSPC."""

    def __init__(self, file: Any, room: int) -> None:
        self.file, self.room = file, room

    def write(self, data: Any) -> int:
        if self.room == 0:
            raise OSError(ENOSPC.errno, ENOSPC.strerror)
        written: int = self.file.write(data[: self.room])
        self.room -= written
        return written

    def flush(self) -> None:
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def json_lines_fill_after(monkeypatch: pytest.MonkeyPatch, room: int) -> list[Filling]:
    """The files `atomr.train.metrics` opens to append to have `room` bytes
    left (`Filling`); returns them, as they are opened."""
    from atomr.train import metrics

    opened: list[Filling] = []

    def open_(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        real = open(file, mode, *args, **kwargs)  # noqa: SIM115
        if "a" not in mode:
            return real
        opened.append(Filling(real, room))
        return opened[-1]

    monkeypatch.setattr(metrics, "open", open_, raising=False)
    return opened


def tensorboard_fills_after(monkeypatch: pytest.MonkeyPatch, events: int) -> list[Any]:
    """tensorboardX writes `events` more events, then each write fails as on a
    full disk: its writer thread dies of the first failure. Thread errors go
    to the list returned instead of stderr."""
    from tensorboardX.event_file_writer import EventsWriter

    write, count = EventsWriter.write_event, itertools.count()

    def write_event(self: Any, event: Any) -> None:
        if next(count) >= events:
            raise OSError(ENOSPC.errno, ENOSPC.strerror)
        write(self, event)

    died: list[Any] = []
    monkeypatch.setattr(EventsWriter, "write_event", write_event)
    monkeypatch.setattr(threading, "excepthook", died.append)
    return died


class Stuck:
    """A write that hangs: `entered` is set once a write blocks, which goes
    on once `release` is set."""

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()


def tensorboard_stuck(monkeypatch: pytest.MonkeyPatch, log: Any) -> Stuck:
    """The next write of `log`'s writer thread to its event file blocks (a
    hung network file system), holding its writer's lock, until
    `Stuck.release` is set (or a minute has passed: a test that fails does
    not leave it for good). Other threads' writes go on: an earlier test's
    writer, still closing in the background, set `entered` for this one."""
    from tensorboardX.record_writer import RecordWriter

    write, stuck = RecordWriter.write, Stuck()

    def hang(self: Any, data: Any) -> None:
        try:
            mine = threading.current_thread() is writer_thread(log)
        except AttributeError:  # its writer is not made yet
            mine = False
        if mine:
            stuck.entered.set()
            stuck.release.wait(60)
        write(self, data)

    monkeypatch.setattr(RecordWriter, "write", hang)
    return stuck


def writer_thread(log: Any) -> threading.Thread:
    """The thread of a `TensorBoardLog`'s writer (tensorboardX 2.6)."""
    thread: threading.Thread = log._writer.file_writer.event_writer._worker
    return thread


def within(seconds: float, call: Callable[[], object]) -> BaseException | None:
    """What `call` raised (None if nothing), run in a daemon thread; fails
    the test if it is still running after `seconds` (it blocked)."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:
            outcome.append(exc)
        else:
            outcome.append(None)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"still blocked after {seconds} s"
    return outcome[0]
