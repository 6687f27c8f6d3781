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


ANCHORED = re.compile(r"\]\(([^)#\s]*)#([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def _anchors(page: Path) -> set[str]:
    """The anchors GitHub makes of `page`'s headings: lower case, spaces to
    dashes, punctuation but '-' and '_' dropped; a repeated one gets -1, -2."""
    text = FENCE.sub("", page.read_text())  # a '# comment' in a code block is no heading
    seen: dict[str, int] = {}
    anchors = set()
    for title in HEADING.findall(text):
        title = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", title)
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_anchors_resolve(page: Path) -> None:
    """A link's #anchor names a heading of the page it points at (the
    headings moved under a link before, and nothing said so)."""
    broken = []
    for target, anchor in ANCHORED.findall(page.read_text()):
        if "://" in target:
            continue
        linked = page.parent / target if target else page
        if linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(f"{target}#{anchor}")
    assert not broken, f"{page.name} links to missing headings: {broken}"


TEST_NAME = re.compile(r"(?<![\w/.])(test_\w+)(?![\w.])")
CITED_FILE = re.compile(r"(?<![\w/])((?:tests|atomr|benchmarks|examples)/[\w/]+\.py)")


def _defined_tests(text: str) -> set[str]:
    return set(re.findall(r"def (test_\w+)", text))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_tests_and_files_a_page_cites_exist(page: Path) -> None:
    """A test or a source file a page names as proof exists under that name
    (distributed.md named a test renamed since, so a reader found nothing).
    A `test_...` name that is an attribute in atomr (`test_accuracy`) or a
    test the page's own code blocks define is no citation."""
    text = page.read_text()
    known = set().union(*(_defined_tests(p.read_text()) for p in ROOT.glob("tests/**/*.py")))
    known |= _defined_tests("\n".join(FENCE.findall(text)))
    known |= {name for p in ROOT.glob("atomr/**/*.py") for name in TEST_NAME.findall(p.read_text())}
    missing = sorted({name for name in TEST_NAME.findall(text) if name not in known})
    missing += sorted({path for path in CITED_FILE.findall(text) if not (ROOT / path).exists()})
    assert not missing, f"{page.name} cites what does not exist: {missing}"
