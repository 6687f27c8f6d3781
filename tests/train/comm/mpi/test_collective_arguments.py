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
