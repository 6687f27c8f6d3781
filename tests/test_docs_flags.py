"""The `atomr train` flags the docs name are the command's own: every flag
of an `atomr train ...` line in docs/ or the README exists, and the option
table of docs/getting_started.md has a row for every flag of
`atomr train --help`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from atomr.cli import main

ROOT = Path(__file__).resolve().parents[1]
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
TRAIN_LINE = re.compile(r"atomr train((?: [^`\n|#;&)]*)?)")


def _train_flags(capsys: pytest.CaptureFixture[str]) -> set[str]:
    """The flags of `atomr train --help`'s usage line."""
    assert main(["train", "--help"]) == 0
    usage = capsys.readouterr().out.split("\n\n", 1)[0]
    return set(FLAG.findall(usage)) - {"--help"}


def _option_table() -> list[str]:
    """The first cells of the rows of getting_started.md's option table."""
    text = (ROOT / "docs" / "getting_started.md").read_text(encoding="utf-8")
    section = text.split("## 3. Options worth knowing", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [row.split(" | ", 1)[0] for row in rows]


def test_every_flag_of_an_atomr_train_line_in_the_docs_exists(
    capsys: pytest.CaptureFixture[str],
) -> None:
    known = _train_flags(capsys)
    unknown = [
        f"{page.name}: {flag}"
        for page in PAGES
        for line in TRAIN_LINE.findall(page.read_text(encoding="utf-8"))
        for flag in FLAG.findall(line)
        if flag not in known
    ]
    table = {flag for cell in _option_table() for flag in FLAG.findall(cell)}
    assert unknown == [] and table - known == set(), (unknown, table - known)


def test_the_option_table_has_a_row_for_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    table = {flag for cell in _option_table() for flag in FLAG.findall(cell)}
    missing = sorted(_train_flags(capsys) - table)
    assert missing == [], missing


def _paragraphs() -> list[str]:
    return [p for page in PAGES for p in re.split(r"\n\s*\n", page.read_text(encoding="utf-8"))]


@pytest.mark.parametrize("command", ["devices", "warmup", "bench", "launch"])
def test_every_flag_of_the_other_commands_is_documented_beside_the_command(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each flag of `atomr <command> --help` is named in a paragraph of the
    docs that names `atomr <command>` (`atomr bench --benchmarks-dir` and
    `--timeout` were in no page)."""
    assert main([command, "--help"]) == 0
    usage = capsys.readouterr().out.split("\n\n", 1)[0]
    flags = set(re.findall(r"(?<![\w-])--?[a-z][a-z0-9-]*", usage)) - {"-h", "--help"}
    paragraphs = [p for p in _paragraphs() if f"atomr {command}" in p]
    missing = sorted(
        flag
        for flag in flags
        if not any(re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", p) for p in paragraphs)
    )
    assert missing == [], f"atomr {command}: {missing}"
