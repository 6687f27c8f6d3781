"""benchmarks/soak.py, the soak docs/reliability.md tells a user to run:
a --scale it cannot run is one usage line, not a traceback from inside a
scenario (it was `ValueError: negative count`, or NaN to integer)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("scale", ["0", "-1", "nan", "inf"])
def test_a_scale_it_cannot_run_is_one_usage_line(scale: str) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "soak.py"), "--scale", scale],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert result.stderr.splitlines()[-1] == (
        f"soak.py: error: --scale must be a positive fraction of the full size, got {float(scale)}"
    )
