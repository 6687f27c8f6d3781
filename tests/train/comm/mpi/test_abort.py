"""`abort_job`, how `MpiCollective.abort` ends the job, refuses a bad
errorcode or grace before anything is printed or aborted (a fake MPI: no
mpiexec or mpi4py needed)."""

from __future__ import annotations

from typing import Any

import pytest

from atomr.train.comm.mpi._abort import abort_job


class _Aborted(Exception):
    """What the fake `MPI_Abort` raises instead of ending the test."""


@pytest.mark.parametrize(
    ("errorcode", "grace", "error", "needle"),
    [
        (True, 0.0, TypeError, "errorcode must be an int, got True"),
        ("2", 0.0, TypeError, "errorcode must be an int, got '2'"),
        (256, 0.0, ValueError, "errorcode must be <= 255, got 256"),
        (-1, 0.0, ValueError, "errorcode must be >= 0, got -1"),
        (2, float("inf"), ValueError, "grace must be a finite number of seconds, got inf"),
        (2, float("nan"), ValueError, "grace must be >= 0 seconds, got nan"),
        (2, -1.0, ValueError, "grace must be >= 0 seconds, got -1.0"),
        (2, "1", TypeError, "grace must be a number of seconds, got str"),
    ],
    ids=["bool", "str", "256", "negative", "inf", "nan", "negative-grace", "str-grace"],
)
def test_abort_refuses_a_bad_argument_and_aborts_nothing(
    errorcode: Any, grace: Any, error: type, needle: str, capsys
) -> None:
    """`abort_job` (what `MpiCollective.abort` runs) is the last call of a
    failing rank: a bad argument used to abort anyway with another status (True: 1; 256: 0, the job's success)
    or to fail inside the sleep (inf) or MPI's call (a str) after the
    message was printed, leaving the job running. Now it is refused before
    anything is printed or aborted."""
    aborted: list[Any] = []

    def fake_abort(code: Any) -> None:
        aborted.append(code)
        raise _Aborted

    fake_mpi = type(
        "FakeMpi", (), {"COMM_WORLD": type("W", (), {"Abort": staticmethod(fake_abort)})}
    )
    with pytest.raises(error) as info:
        abort_job(fake_mpi, 0, errorcode, "the message", grace)
    assert needle in str(info.value)
    assert aborted == [] and "the message" not in capsys.readouterr().err
    with pytest.raises(_Aborted):
        abort_job(fake_mpi, 0, 3, "the message", 0)
    assert aborted == [3] and "[rank 0] the message" in capsys.readouterr().err
