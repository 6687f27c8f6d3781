"""Every relative link in README.md and docs/*.md points at a file that exists,
and every page in docs/ is reachable from docs/index.md."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _relative_links(page: Path) -> list[str]:
    return [
        t for t in LINK.findall(page.read_text()) if "://" not in t and not t.startswith("mailto:")
    ]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page: Path) -> None:
    missing = [t for t in _relative_links(page) if not (page.parent / t).exists()]
    assert not missing, f"{page.name} links to missing files: {missing}"


def test_index_reaches_every_page() -> None:
    linked = {Path(t).name for t in _relative_links(ROOT / "docs" / "index.md")}
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"index.md"}
    assert pages <= linked, f"docs/index.md does not link {sorted(pages - linked)}"
