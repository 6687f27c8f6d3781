"""Every complete program in docs/actors.md runs."""

from __future__ import annotations

import re
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
