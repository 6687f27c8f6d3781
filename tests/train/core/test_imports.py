"""`atomr.train.core` imports what it uses at the top of each module: no import
inside a function or under `TYPE_CHECKING` hides a cycle between its modules."""

from __future__ import annotations

import ast
from pathlib import Path

import atomr.train.core as core

CORE = Path(core.__file__).parent


def _hidden_atomr_imports(path: Path) -> list[str]:
    """The `atomr` imports of `path` that are not statements of the module body."""
    tree = ast.parse(path.read_text())
    top = set(map(id, tree.body))
    found = []
    for node in ast.walk(tree):
        if id(node) in top or not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        names = (
            [node.module or ""]
            if isinstance(node, ast.ImportFrom)
            else [a.name for a in node.names]
        )
        found += [f"{path.name}:{node.lineno} {n}" for n in names if n.startswith("atomr")]
    return found


def test_core_has_no_hidden_imports() -> None:
    hidden = [h for path in sorted(CORE.glob("*.py")) for h in _hidden_atomr_imports(path)]
    assert hidden == []
