"""Every name a user imports is in the documentation: each name in the
`__all__` of the packages a user imports from (`atomr`, `atomr.accel`,
`atomr.testkit`, `atomr.train` with `core`, `core.model`, `comm` and one
package per strategy) is named in README.md or a page of docs/, so a name
found by `dir()` or an editor's completion has a page that says what it is
(`atomr.Mailbox`, `ShardedReplicaProtocol`, `global_norm`, ... had none).
Docstrings are tests/test_docstrings.py's."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (
    "atomr",
    "atomr.accel",
    "atomr.testkit",
    "atomr.train",
    "atomr.train.core",
    "atomr.train.core.model",
    "atomr.train.comm",
    "atomr.train.comm.mpi",
    "atomr.train.data_parallel",
    "atomr.train.sharded",
    "atomr.train.tensor_parallel",
    "atomr.train.pipeline",
    "atomr.train.parameter_server",
)
DUNDER = re.compile(r"__\w+__")


def _documentation() -> str:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return "\n".join(page.read_text(encoding="utf-8") for page in pages)


@pytest.mark.parametrize("package", PACKAGES)
def test_every_exported_name_is_named_in_the_docs(package: str) -> None:
    text = _documentation()
    names = [n for n in importlib.import_module(package).__all__ if not DUNDER.fullmatch(n)]
    assert names, f"{package} exports nothing"
    missing = [n for n in names if not re.search(rf"(?<!\w){re.escape(n)}\b", text)]
    assert missing == [], f"{package} exports names no page names: {missing}"
