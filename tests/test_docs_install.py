"""Every `pip install` the docs, the README and atomr's own messages tell a
user to run installs this checkout (`pip install -e ".[extra]"`), never a
package named `atomr` from the package index: PyPI's `atomr` is another
project (a Rust actor runtime, at a higher version number), so
`pip install 'atomr[mpi]'` replaced this one. And every extra named exists."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEXTS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "atomr").rglob("*.py")),
    *sorted((ROOT / "examples").glob("*.py")),
]
INSTALL = re.compile(r"pip\s+install\s+([^`\n)&;#]*)")
FROM_INDEX = re.compile(r"""(?:^|\s)['"]?atomr\b""")
EXTRAS = re.compile(r"""['"]?\.\[([\w,-]+)\]['"]?""")


def _installs() -> list[tuple[str, str]]:
    """`(file, what follows 'pip install')` for every install the texts name."""
    return [
        (str(path.relative_to(ROOT)), found.strip())
        for path in TEXTS
        for found in INSTALL.findall(path.read_text(encoding="utf-8"))
    ]


def test_no_text_installs_atomr_from_the_package_index() -> None:
    wrong = [(name, args) for name, args in _installs() if FROM_INDEX.search(args)]
    assert wrong == [], wrong


def test_every_extra_an_install_names_exists() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    extras = set(project["project"]["optional-dependencies"])
    named = [
        (name, extra)
        for name, args in _installs()
        for group in EXTRAS.findall(args)
        for extra in group.split(",")
    ]
    assert len(named) >= 10  # the README's, the pages' and the error messages'
    unknown = [(name, extra) for name, extra in named if extra not in extras]
    assert unknown == [], unknown
