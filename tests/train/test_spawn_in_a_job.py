"""A trainer's `spawn` in a multi-process job: a failure on one process (a
replica that cannot start or allocate, arguments only that process refuses) fails the
spawn on every process before the initial weight broadcast, the others with
an error naming the failing rank instead of a `CollectiveTimeoutError`, and
leaves nothing running (data parallel and ZeRO, the strategies a job runs)."""

from __future__ import annotations

import json

import pytest

from tests.train.mpi_scripts.harness import run_script

pytestmark = pytest.mark.mpi

OWN_ERRORS = {"start": "ActorStoppedError", "allocate": "MemoryError", "check": "ValueError"}
CASES = (
    "data/start",
    "data/allocate",
    "data/check",
    "zero1/start",
    "zero2/allocate",
    "zero3/start",
    "zero3/check",
)
"""What spawn_fault.py reports (strategy/fault, its module docstring)."""


def test_a_spawn_failing_on_one_process_fails_on_every_process_naming_it(tmp_path) -> None:
    result, _ = run_script(2, "spawn_fault.py", tmp_path, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    others, failing = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert sorted(others) == sorted(failing) == sorted([*CASES, "after"])
    for case in CASES:
        theirs, mine = others[case], failing[case]
        # not the collective's timeout:
        assert theirs["type"] == "OtherProcessFailed", (case, theirs)
        assert "process rank 1 failed to start its trainer" in theirs["message"], case
        assert mine["type"] == OWN_ERRORS[case.split("/")[1]], (
            case,
            mine,
        )  # rank 1's own error, its rank noted
        assert any("on process rank 1" in note for note in mine["notes"]), (case, mine)
        assert theirs["actors"] == mine["actors"] == 0, case
    assert others["after"] == failing["after"]  # the processes still take the same collectives
