"""A rank of `atomr train --distributed` interrupted (a SIGTERM, here) while
the job starts tells the other ranks, so that the whole job ends at once,
instead of the interrupted rank ending alone and the others waiting for it
until their start-up deadline (120 s): before the ranks exchange their
options, every rank stops with the same line naming it, as for a rank that
failed there; while they exchange them, the run stops before its first step
on every rank, as a signal during training stops it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.cli.test_distributed_agreement import TINY, _mpiexec
from tests.cli.test_distributed_failures import QUICK_S

SCRIPT = [sys.executable, str(Path(__file__).with_name("interrupted_rank.py"))]
LINE = "--distributed: rank 1 failed before training: interrupted (SIGTERM)"


@pytest.mark.mpi
@pytest.mark.parametrize("point", ["loading", "load_dataset"])
def test_a_rank_interrupted_before_the_exchange_stops_every_rank(
    tmp_path: Path, point: str
) -> None:
    run = tmp_path / "run"
    code, err = _mpiexec(2, [*SCRIPT, point, *TINY, "--run-dir", str(run)], timeout=QUICK_S)
    assert code == 143, err
    assert err.count(f"atomr: error: {LINE}") == 2, err  # mpiexec may interleave the writes
    assert not err.replace(f"atomr: error: {LINE}", "").strip(), err
    assert not run.exists()


@pytest.mark.mpi
def test_a_rank_interrupted_as_the_ranks_join_stops_the_run_on_every_rank(
    tmp_path: Path,
) -> None:
    run = tmp_path / "run"
    code, err = _mpiexec(2, [*SCRIPT, "joining", *TINY, "--run-dir", str(run)], timeout=QUICK_S)
    assert code == 143, err  # rank 1's: 128 + SIGTERM (rank 0 exits 130)
    assert "Traceback" not in err
    assert "atomr: SIGTERM: stopping after this step" in err  # rank 1
    assert "atomr: interrupted" in err  # rank 0, having written the outputs
    history = json.loads((run / "history.json").read_text())
    assert (history["status"], history["epochs"]) == ("interrupted", [])


@pytest.mark.mpi
def test_a_rank_killed_by_a_second_sigterm_in_training_ends_the_job(tmp_path: Path) -> None:
    """The documented behaviour (docs/distributed.md, "A rank stopped twice
    in training"): the second signal kills rank 1 by its default action;
    hydra then kills rank 0 at once, without a word from it, or rank 0 waits
    out its collective timeout (here 10 s) and names rank 1 as it names a
    frozen rank. Either way the job ends, non-zero, within the deadline."""
    run = tmp_path / "run"
    argv = [*SCRIPT, "training_twice", *TINY, "--run-dir", str(run)]
    code, err = _mpiexec(2, argv, timeout=QUICK_S)
    assert code not in (0, 124), err  # 124: still running at the deadline
    assert "atomr: SIGTERM: stopping after this step" in err  # rank 1's first signal
    assert "Traceback" not in err
    if "[rank 0]" in err:  # it waited for rank 1, then ended the job
        assert "rank 1 never joined (dead, stuck or out of step)" in err, err
