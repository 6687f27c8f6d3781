"""Every example answers `--help` with its usage and refuses an option it
does not take (exit 2), as a command does: `--help` used to run the whole
example, and an unknown option was silently ignored, in the 8 that take no
options."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(path.name for path in (ROOT / "examples").glob("*.py"))


def _run(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def test_the_examples_are_found() -> None:
    assert len(EXAMPLES) >= 12 and "single_device.py" in EXAMPLES


@pytest.mark.parametrize("name", EXAMPLES)
def test_help_prints_the_usage_and_runs_nothing(name: str) -> None:
    result = _run(name, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: {name}"), result.stdout


@pytest.mark.parametrize("name", EXAMPLES)
def test_an_unknown_option_is_refused(name: str) -> None:
    result = _run(name, "--no-such-option")
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert "unrecognized arguments: --no-such-option" in result.stderr


def _options_without_help(usage: str) -> list[str]:
    """The options of a `--help` text that say nothing: argparse puts an
    option's help on its line or, when the option is long, on the next one,
    indented further."""
    lines = usage.split("\noptions:\n", 1)[1].splitlines()
    bare = []
    for k, line in enumerate(lines):
        found = re.match(r"  (-[^ ].*?)(?:  +(\S.*))?$", line)
        if found and found.group(2) is None:
            following = lines[k + 1] if k + 1 < len(lines) else ""
            if not re.match(r" {6,}\S", following):
                bare.append(found.group(1))
    return bare


@pytest.mark.parametrize("name", EXAMPLES)
def test_help_says_what_the_example_shows_and_what_each_option_does(name: str) -> None:
    """`--help` prints the module docstring (getting_started.md: "`--help`:
    what it shows and the options it takes"), and every option a line of
    its own (data_parallel.py, gpt.py and sharded_data_parallel.py printed
    a one-line title, and their options, like web_service.py's --host and
    --ask-timeout, said nothing)."""
    doc = ast.get_docstring(ast.parse((ROOT / "examples" / name).read_text(encoding="utf-8")))
    assert doc, name
    usage = _run(name, "--help").stdout
    assert " ".join(doc.split()) in " ".join(usage.split()), usage
    assert _options_without_help(usage) == [], usage
