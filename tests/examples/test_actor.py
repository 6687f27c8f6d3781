"""The runtime examples run as scripts and print what their docstrings promise."""

from __future__ import annotations


def test_ping_pong(run_example) -> None:
    out = run_example("ping_pong.py", timeout=60).splitlines()
    assert out == [f"pong {i}" for i in range(1, 6)] + ["done after 5 rounds"]


def test_worker_pool(run_example) -> None:
    out = run_example("worker_pool.py", timeout=60).splitlines()
    poisoned = [j for j in range(20) if j % 7 == 3]
    assert out[0] == f"ok={20 - len(poisoned)} failed={len(poisoned)} restarts={len(poisoned)}"
    good = sum(j * j for j in range(20) if j not in poisoned)
    assert out[1] == f"sum of squares of good jobs: {good}"
