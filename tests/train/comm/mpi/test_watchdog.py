"""`watch_launcher` outside a launched job (the job itself: test_launch.py)."""

from __future__ import annotations

import pytest

from atomr.train.comm.mpi.watchdog import LAUNCHER_PID_ENV, watch_launcher


@pytest.mark.parametrize("value", [None, "", "abc", "-5", "1", "0"])
def test_no_launcher_pid_means_nothing_watched(value: str | None) -> None:
    env = {} if value is None else {LAUNCHER_PID_ENV: value}
    assert watch_launcher(env) is False
