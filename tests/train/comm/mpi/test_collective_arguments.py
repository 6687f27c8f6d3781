"""`MpiCollective` and `MpiCollective.from_config` refuse a bad argument
before MPI starts (no mpiexec needed): a bool or string timeout was taken
as 1 second or failed on a comparison, infinity was taken although None is
the way to wait forever, and a config of another type failed on a missing
attribute."""

from __future__ import annotations

import sys
from typing import Any

import pytest

pytest.importorskip("mpi4py")

from atomr.train.comm.mpi.collective import MpiCollective  # noqa: E402


@pytest.mark.parametrize(
    ("timeout", "error", "needle"),
    [
        (True, TypeError, "timeout must be a number of seconds or None, got bool"),
        ("5", TypeError, "timeout must be a number of seconds or None, got str"),
        (float("nan"), ValueError, "timeout must be > 0 seconds or None, got nan"),
        (0, ValueError, "timeout must be > 0 seconds or None, got 0"),
        (-1.0, ValueError, "timeout must be > 0 seconds or None, got -1.0"),
        (float("inf"), ValueError, "timeout must be a finite number of seconds or None"),
    ],
    ids=["bool", "str", "nan", "zero", "negative", "inf"],
)
def test_a_bad_timeout_is_refused_before_mpi_starts(
    timeout: Any, error: type, needle: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[Any] = []
    monkeypatch.setattr(
        sys.modules[MpiCollective.__module__],
        "open_communicators",
        lambda *args: started.append(args),
    )
    with pytest.raises(error) as info:
        MpiCollective(timeout=timeout)
    assert needle in str(info.value)
    assert started == []


@pytest.mark.parametrize("config", [None, {"collective_timeout": 5.0}, 5.0])
def test_from_config_refuses_what_is_no_config_before_mpi_starts(
    config: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[Any] = []
    monkeypatch.setattr(
        sys.modules[MpiCollective.__module__],
        "open_communicators",
        lambda *args: started.append(args),
    )
    with pytest.raises(TypeError, match="config must be a DistributedTrainConfig, got"):
        MpiCollective.from_config(config)
    assert started == []


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
    errorcode: Any, grace: Any, error: type, needle: str, monkeypatch, capsys
) -> None:
    """`abort` is the last call of a failing rank: a bad argument used to
    abort anyway with another status (True: 1; 256: 0, the job's success)
    or to fail inside the sleep (inf) or MPI's call (a str) after the
    message was printed, leaving the job running. Now it is refused before
    anything is printed or aborted."""
    aborted: list[Any] = []

    def fake_abort(code: Any) -> None:
        aborted.append(code)
        raise _Aborted

    coll = object.__new__(MpiCollective)  # no MPI: only what abort touches
    coll.rank = 0
    coll._mpi = type(
        "FakeMpi", (), {"COMM_WORLD": type("W", (), {"Abort": staticmethod(fake_abort)})}
    )
    with pytest.raises(error) as info:
        coll.abort(errorcode, "the message", grace=grace)
    assert needle in str(info.value)
    assert aborted == [] and "the message" not in capsys.readouterr().err
    with pytest.raises(_Aborted):
        coll.abort(3, "the message", grace=0)
    assert aborted == [3] and "[rank 0] the message" in capsys.readouterr().err
