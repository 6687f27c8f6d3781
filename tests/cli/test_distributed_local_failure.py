"""A rank of `atomr train --distributed` that fails on its own during
training (not in a collective) tells the others once its error is out
(`MpiJob.failed`, `MpiCollective.report_failure`): their collective fails
at once naming it, and they end the job, instead of waiting for it until
the collective's timeout (120 s)."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

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
