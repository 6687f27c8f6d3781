"""The runtime examples run as scripts and print what their docstrings promise."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_example(name: str) -> str:
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name)],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_ping_pong() -> None:
    out = run_example("ping_pong.py").splitlines()
    assert out == [f"pong {i}" for i in range(1, 6)] + ["done after 5 rounds"]


def test_worker_pool() -> None:
    out = run_example("worker_pool.py").splitlines()
    poisoned = [j for j in range(20) if j % 7 == 3]
    assert out[0] == f"ok={20 - len(poisoned)} failed={len(poisoned)} restarts={len(poisoned)}"
    good = sum(j * j for j in range(20) if j not in poisoned)
    assert out[1] == f"sum of squares of good jobs: {good}"
