"""A rank of `atomr train --distributed` that fails on its own after the
ranks agreed (not in a collective: while its trainer starts, loading its
`--resume` checkpoint, during training) tells the others once its error is
out (`MpiJob.failed`, `MpiCollective.report_failure`): their collective
fails at once naming it, and they end the job, instead of waiting for it
until the collective's timeout (120 s). A failure every rank meets alike
still ends each with its own line."""

from __future__ import annotations

import asyncio
import errno
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import atomr.cli.training_run as training_run
from atomr.cli.dataset import load_dataset
from atomr.cli.history import History
from atomr.cli.job import Job
from atomr.cli.parser import build_parser
from atomr.cli.run_config import RunConfig
from atomr.cli.training_run import plan_start, train_epochs
from atomr.train.fit import StopFlag
from tests.cli.test_distributed_agreement import TINY, _mpiexec

QUICK_S = 60.0  # far more than the job takes now; less than the collective's timeout


@pytest.mark.mpi
def test_a_rank_failing_alone_in_training_ends_the_job_at_once(tmp_path: Path) -> None:
    metrics = tmp_path / "m.jsonl"
    script = [sys.executable, str(Path(__file__).with_name("step_log_failure.py")), *TINY]
    started = time.monotonic()
    code, err = _mpiexec(
        2, [*script, "--run-dir", str(tmp_path / "run"), "--metrics", str(metrics)],
        timeout=QUICK_S,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert code not in (0, 124), err
    # rank 0's own error first (its outputs written), then rank 1's, naming it
    mine = f"atomr: error: training failed: cannot write --metrics {metrics}: No space left"
    assert mine in err, err
    assert (tmp_path / "run" / "history.json").exists()
    theirs = re.search(
        r"\[rank 1\] RankFailedError: MPI \w+ #\d+ on rank 1 of 2 could not complete: "
        r"rank 0 reported a failure of its own and left \(see its error\)",
        err,
    )
    assert theirs is not None, err
    assert err.index(mine) < theirs.start(), err
    assert "CollectiveTimeoutError" not in err, err
    assert elapsed < 30.0, f"took {elapsed:.1f} s"


class _Collective:
    """Counts `report_failure` calls (a job's collective, without MPI)."""

    def __init__(self) -> None:
        self.reports = 0

    def report_failure(self) -> None:
        self.reports += 1


def test_only_a_failure_of_this_rank_alone_is_told_and_only_once() -> None:
    from atomr.cli.job import MpiJob

    collective = _Collective()
    job = MpiJob(collective, is_root=True)
    with pytest.raises(ValueError), job.aborting():  # e.g. the options' agreement: all fail
        raise ValueError("every rank raises this")
    job.failed()
    assert collective.reports == 0
    with pytest.raises(OSError), job.aborting(alone=True):  # in `fit`
        raise OSError("this rank's disk")
    assert collective.reports == 0  # told only once the error is out
    job.failed()
    job.failed()
    assert collective.reports == 1


def _resume_on_two_ranks(
    tmp_path: Path, checkpoint: Path, monkeypatch: pytest.MonkeyPatch, damaged: str
) -> tuple[int, str, float, list[Path]]:
    """`resume_load_failure.py` on 2 ranks, each resuming from its own copy
    of `checkpoint`, those of the `damaged` ranks damaged after the
    agreement: exit status, stderr, seconds taken and the copies."""
    copies = [tmp_path / f"rank{r}.ckpt" for r in range(2)]
    for copy in copies:
        shutil.copy(checkpoint, copy)
    monkeypatch.setenv("ATOMR_TEST_DAMAGED", damaged)
    script = [sys.executable, str(Path(__file__).with_name("resume_load_failure.py"))]
    ranks = [
        [*script, *TINY, "--epochs", "2", "--run-dir", str(tmp_path / f"r{r}"),
         "--resume", str(copies[r])]
        for r in range(2)
    ]  # fmt: skip
    started = time.monotonic()
    code, err = _mpiexec(1, [*ranks[0], ":", "-n", "1", *ranks[1]], timeout=QUICK_S)
    return code, err, time.monotonic() - started, copies


@pytest.mark.mpi
def test_a_checkpoint_one_rank_cannot_load_ends_the_job_at_once(
    tmp_path: Path, checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, err, elapsed, copies = _resume_on_two_ranks(tmp_path, checkpoint, monkeypatch, "1")
    assert code not in (0, 124), err
    mine = f"atomr: error: --resume: {copies[1]}: not an atomr checkpoint"
    assert mine in err, err
    theirs = re.search(
        r"\[rank 0\] RankFailedError: MPI \w+ #\d+ on rank 0 of 2 could not complete: "
        r"rank 1 reported a failure of its own and left \(see its error\)",
        err,
    )
    assert theirs is not None, err
    assert err.index(mine) < theirs.start(), err
    assert "CollectiveTimeoutError" not in err, err
    assert elapsed < 30.0, f"took {elapsed:.1f} s"


@pytest.mark.mpi
def test_a_checkpoint_no_rank_can_load_ends_each_with_its_own_line(
    tmp_path: Path, checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, err, elapsed, copies = _resume_on_two_ranks(tmp_path, checkpoint, monkeypatch, "0,1")
    assert code == 2, err
    before, *lines = err.split("atomr: error: ")  # mpiexec may interleave the writes
    assert not before.strip() and len(lines) == 2, err
    expected = {f"--resume: {copy}: not an atomr checkpoint (bad magic or truncated)"
                for copy in copies}  # fmt: skip
    assert {line.strip() for line in lines} == expected, err
    assert elapsed < 30.0, f"took {elapsed:.1f} s"


@pytest.mark.mpi
def test_a_model_one_rank_cannot_build_ends_the_job_at_once(tmp_path: Path) -> None:
    script = [sys.executable, str(Path(__file__).with_name("model_failure.py")), *TINY]
    started = time.monotonic()
    code, err = _mpiexec(2, [*script, "--run-dir", str(tmp_path / "run")], timeout=QUICK_S)
    elapsed = time.monotonic() - started
    assert code not in (0, 124), err
    mine = "atomr: error: [Errno 12] Cannot allocate memory"
    assert mine in err, err
    theirs = err.find("[rank 0] RankFailedError: ")
    assert theirs > err.index(mine), err
    assert "rank 1 reported a failure of its own and left" in err[theirs:], err
    assert elapsed < 30.0, f"took {elapsed:.1f} s"


class _TellingJob(Job):
    """A job of one that records what `abort` is given."""

    def __init__(self) -> None:
        self.aborted: list[tuple[BaseException, bool]] = []

    def abort(self, error: BaseException, alone: bool = False) -> None:
        self.aborted.append((error, alone))


def test_a_failure_while_the_trainer_starts_is_this_ranks_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    full = OSError(errno.ENOMEM, os.strerror(errno.ENOMEM))

    def no_memory(*_: Any) -> Any:
        raise full

    monkeypatch.setattr(training_run, "_model", no_memory)
    args = build_parser("test").parse_args(["train", *TINY, "--run-dir", str(tmp_path)])
    run = RunConfig.from_args(args)
    data, history, job = load_dataset(run), History(config=run.to_json()), _TellingJob()
    start = plan_start(run, data, history)
    with pytest.raises(OSError) as raised:
        asyncio.run(train_epochs(run, data, history, StopFlag(), job=job, start=start))
    assert raised.value is full
    assert job.aborted == [(full, True)]
