"""Helpers shared by the whole test suite."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parents[1]

# CI (CI=true) replays the same hypothesis examples on every run, so a red run
# can be reproduced; a developer's run explores new examples each time.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


def _run_example(name: str, *args: str, timeout: float = 120) -> str:
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture
def run_example() -> Callable[..., str]:
    """`run_example(name, *args, timeout=120)`: run `examples/<name>` as a script
    from the repository root, assert that it exits with 0 (its stderr as the
    message) and return its stdout."""
    return _run_example
