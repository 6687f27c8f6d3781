"""`StartupDeadline` outside a launched job (the job itself: test_launch.py)."""

from __future__ import annotations

from pathlib import Path

from atomr.train.comm.mpi.startup import (
    STARTUP_DIR_ENV,
    StartupDeadline,
    failure_reports,
    missing_ranks,
)


def test_outside_a_launcher_nothing_is_armed(tmp_path: Path) -> None:
    deadline = StartupDeadline(0.01, environ={STARTUP_DIR_ENV: str(tmp_path)})
    assert (deadline.rank, deadline.world_size) == (0, 1)
    deadline.done()  # no watchdog to stop; the process is still here


def test_each_rank_marks_its_arrival_and_the_missing_ones_are_named(tmp_path: Path) -> None:
    env = {"PMI_RANK": "2", "PMI_SIZE": "4", STARTUP_DIR_ENV: str(tmp_path)}
    deadline = StartupDeadline(None, environ=env)  # None: mark, arm nothing
    deadline.done()
    assert missing_ranks(tmp_path, 4) == [0, 1, 3]
    assert failure_reports(tmp_path) == []
    (tmp_path / "rank-0.failed").write_text("rank 0 gave up\n")
    assert failure_reports(tmp_path) == ["rank 0 gave up"]


def test_a_missing_or_bad_directory_only_loses_the_names(tmp_path: Path) -> None:
    env = {"PMI_RANK": "0", "PMI_SIZE": "2", STARTUP_DIR_ENV: str(tmp_path / "gone")}
    StartupDeadline(None, environ=env).done()
    assert not (tmp_path / "gone").exists()
