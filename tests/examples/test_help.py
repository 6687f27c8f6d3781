"""Every example answers `--help` with its usage and refuses an option it
does not take (exit 2), as a command does: `--help` used to run the whole
example, and an unknown option was silently ignored, in the 8 that take no
options."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(path.name for path in (ROOT / "examples").glob("*.py"))


def _run(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def test_the_examples_are_found() -> None:
    assert len(EXAMPLES) >= 12 and "single_device.py" in EXAMPLES


@pytest.mark.parametrize("name", EXAMPLES)
def test_help_prints_the_usage_and_runs_nothing(name: str) -> None:
    result = _run(name, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: {name}"), result.stdout


@pytest.mark.parametrize("name", EXAMPLES)
def test_an_unknown_option_is_refused(name: str) -> None:
    result = _run(name, "--no-such-option")
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert "unrecognized arguments: --no-such-option" in result.stderr
