"""The Python snippets of the pages in `PAGES` run as written (each in a
fresh interpreter, in an empty folder). docs/actors.md's programs run in
tests/actor/test_docs.py; docs/distributed.md's complete programs run on
two MPI ranks (marker `mpi`); the pages left out (index, benchmarks: no
Python) hold no snippet that runs on its own."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.train.mpi_scripts.harness import require_mpi

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
MPI_PAGES = ("distributed.md",)
BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)


def _snippets(pages: tuple[str, ...] = PAGES) -> list[tuple[str, str]]:
    """`(id, code)` of every ```python block on the pages."""
    found = []
    for page in pages:
        blocks = BLOCK.findall((ROOT / "docs" / page).read_text(encoding="utf-8"))
        found += [(f"{page}:{i}", code) for i, code in enumerate(blocks)]
    return found


SNIPPETS = _snippets()
MPI_PROGRAMS = [(name, code) for name, code in _snippets(MPI_PAGES) if "atomr.run(main())" in code]


def test_the_pages_have_snippets() -> None:
    assert len(SNIPPETS) >= 3
    assert MPI_PROGRAMS  # distributed.md's program is complete (it was a fragment)


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


@pytest.mark.mpi
@pytest.mark.parametrize(("name", "code"), MPI_PROGRAMS, ids=[name for name, _ in MPI_PROGRAMS])
def test_mpi_program_runs_on_two_ranks(
    name: str, code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_mpi()
    from atomr.train.comm.mpi.launch import run_mpiexec

    script = tmp_path / "train.py"
    script.write_text(code, encoding="utf-8")
    monkeypatch.chdir(tmp_path)  # the program writes its checkpoint here
    result = run_mpiexec(2, [sys.executable, str(script)], timeout=240, capture=True)
    assert result.returncode == 0, f"{name} failed:\n{result.stdout}\n{result.stderr}"
    # mpiexec forwards each rank's output as it comes: one rank's line may
    # run into the other's, so the lines are found by pattern, not split
    found = dict(re.findall(r"rank (\d+): loss (\S+?)(?=rank |\s|$)", result.stdout))
    assert sorted(found) == ["0", "1"], result.stdout  # both ranks
    assert len(set(found.values())) == 1, result.stdout  # one loss
