"""No test waits for something by sleeping a fixed time.

A sleep of a fixed length either wastes time or, on a loaded machine, ends
before what it waited for happened. Tests wait for a message (TestProbe), an
event, or a condition under a deadline (``atomr.testkit.await_condition`` /
``wait_until``). A sleep of a literal length is allowed only where the sleep
itself is the scenario (a slow handler, a late peer, a hang to be cut off);
such a line, or the line above it, says so in a comment. Sleeps of an hour or
more are hangs by construction and need no comment.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
HANG_S = 3600.0


def _literal_sleeps(tree: ast.AST) -> list[tuple[int, float]]:
    """(line, seconds) of each ``sleep(<number>)`` call with a positive number."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        arg = node.args[0]
        if name == "sleep" and isinstance(arg, ast.Constant):
            value = arg.value
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
                found.append((node.lineno, float(value)))
    return sorted(found)


def _unexplained(path: Path) -> list[str]:
    lines = path.read_text().splitlines()
    bad = []
    for line_no, seconds in _literal_sleeps(ast.parse("\n".join(lines), str(path))):
        here, above = lines[line_no - 1], lines[line_no - 2] if line_no > 1 else ""
        if seconds < HANG_S and "#" not in here and not above.strip().startswith("#"):
            bad.append(f"{path.relative_to(TESTS.parent)}:{line_no}: {here.strip()}")
    return bad


def test_every_fixed_sleep_in_the_tests_says_why_it_is_not_a_wait() -> None:
    bad = [entry for path in sorted(TESTS.rglob("*.py")) for entry in _unexplained(path)]
    assert not bad, "fixed sleeps with no comment (wait for a condition instead):\n" + "\n".join(
        bad
    )


def test_the_check_finds_an_unexplained_sleep() -> None:
    source = "import asyncio\nasync def f():\n    await asyncio.sleep(0.05)\n    time.sleep(3600)\n"
    assert _literal_sleeps(ast.parse(source)) == [(3, 0.05), (4, 3600.0)]
