"""Every complete program in docs/actors.md runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "actors.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
PROGRAMS = [b for b in BLOCKS if "atomr.run(main())" in b]


def test_doc_has_programs() -> None:
    assert len(PROGRAMS) >= 8


@pytest.mark.parametrize("source", PROGRAMS, ids=[f"snippet{i}" for i in range(len(PROGRAMS))])
def test_snippet_runs(source: str, capsys: pytest.CaptureFixture[str]) -> None:
    exec(compile(source, str(DOC), "exec"), {"__name__": "__doc_snippet__"})
    assert capsys.readouterr().out.strip()  # each program prints its result


def test_testing_snippet_passes_under_pytest_with_the_documented_config(tmp_path: Path) -> None:
    """The Testing section's tests pass in a fresh project configured as it
    says, each block a test module of its own (the second shares one system)."""
    config = re.search(r"```toml\n(.*?)```", DOC.read_text(), flags=re.S)
    tests = [b for b in BLOCKS if "actor_system" in b and "async def test_" in b]
    assert config and len(tests) == 2
    (tmp_path / "pyproject.toml").write_text(config.group(1))
    for i, test in enumerate(tests):
        (tmp_path / f"test_snippet{i}.py").write_text(test)
    env = {**os.environ, "PYTHONPATH": str(DOC.parents[1])}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 passed" in result.stdout
