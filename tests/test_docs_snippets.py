"""The Python snippets of the pages in `PAGES` run as written (each in a
fresh interpreter, in an empty folder). docs/actors.md's programs run in
tests/actor/test_docs.py; the pages left out (distributed.md: MPI; index,
benchmarks: no Python) hold no snippet that runs on its own."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = (
    "getting_started.md",
    "training.md",
    "reliability.md",
    "sharded.md",
    "models.md",
    "data_parallel.md",
    "tensor_parallel.md",
    "pipeline_parallel.md",
    "parameter_server.md",
    "collectives.md",
    "devices.md",
    "internals.md",
)
BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)


def _snippets() -> list[tuple[str, str]]:
    """`(id, code)` of every ```python block on the pages."""
    found = []
    for page in PAGES:
        blocks = BLOCK.findall((ROOT / "docs" / page).read_text(encoding="utf-8"))
        found += [(f"{page}:{i}", code) for i, code in enumerate(blocks)]
    return found


SNIPPETS = _snippets()


def test_the_pages_have_snippets() -> None:
    assert len(SNIPPETS) >= 3


@pytest.mark.parametrize(("name", "code"), SNIPPETS, ids=[name for name, _ in SNIPPETS])
def test_snippet_runs(name: str, code: str, tmp_path: Path) -> None:
    script = tmp_path / "snippet.py"
    script.write_text(code, encoding="utf-8")
    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 0, f"{name} failed:\n{result.stderr}"
    if "class Counter" in code:
        assert result.stdout.strip() == "5"
