"""`atomr launch` checks the ranks' `atomr train` arguments itself before it
starts MPI: a refusal that every rank would print (once each, glued together
by mpiexec) is one line, exit status 2, and no rank is started."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from atomr.cli import main
from atomr.train.comm.mpi import launch
from tests.cli.test_distributed_agreement import ROOT, TINY
from tests.train.mpi_scripts.harness import require_mpi

DEADLINE_S = 60.0  # far more than a refusal takes; a job started would still end

REFUSED = [
    (
        ["--strategy", "tensor"],
        "--distributed runs data parallel (plain or sharded) across MPI ranks; it cannot be "
        "combined with --strategy tensor",
    ),
    (["--momentum", "0.5"], "--momentum only applies to --optimizer sgd"),
    (["--bogus"], "unrecognized arguments: --bogus (see 'atomr train --help')"),
]


@pytest.mark.mpi
@pytest.mark.parametrize(("argv", "message"), REFUSED, ids=[a[0] for a, _ in REFUSED])
def test_train_arguments_every_rank_would_refuse_are_refused_once(
    argv: list[str], message: str
) -> None:
    """Each rank printed 'atomr: error: --distributed: rank 0 failed before
    training: ...; rank 1 failed before training: ...', the two lines
    sometimes glued into one."""
    require_mpi()
    done = subprocess.run(
        [sys.executable, "-m", "atomr.cli", "launch", "-n", "2", "--", *TINY, *argv],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [f"atomr: error: {message}"]
    assert not done.stdout


def test_no_rank_is_started_for_refused_arguments_and_fine_ones_reach_the_ranks(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    launched: list[tuple[int, list[str]]] = []
    monkeypatch.setattr(launch, "launch", lambda n, argv, **kw: launched.append((n, argv)) or 0)
    assert main(["launch", "-n", "2", "--", "train", "--strategy", "pipeline"]) == 2
    assert "cannot be combined with --strategy pipeline" in capsys.readouterr().err
    assert launched == []
    assert main(["launch", "-n", "2", "--", "--epochs", "1"]) == 0
    assert launched == [(2, ["--distributed", "--epochs", "1"])]
