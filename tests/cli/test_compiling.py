"""A first run (kernels not in numba's cache) says it is compiling kernels
before its first step; a run with cached kernels does not."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import numba

from atomr.cli.compiling import COMPILING_NOTICE, say_when_compiling


def test_the_first_compile_prints_the_notice_once() -> None:
    out = io.StringIO()
    with say_when_compiling(stream=out):
        numba.njit(lambda x: x + 1)(1)
        numba.njit(lambda x: x * 2)(1)
    numba.njit(lambda x: x - 1)(1)  # after the block: nothing more
    assert out.getvalue().splitlines() == [COMPILING_NOTICE]


def test_quiet_says_nothing() -> None:
    out = io.StringIO()
    with say_when_compiling(enabled=False, stream=out):
        numba.njit(lambda x: x + 3)(1)
    assert out.getvalue() == ""


def _train(tmp_path: Path, cache: Path, name: str) -> str:
    argv = ["train", "--strategy", "single", "--dataset", "synthetic", "--samples", "200"]
    argv += ["--epochs", "1", "--run-dir", str(tmp_path / name)]
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache)}
    done = subprocess.run(
        [sys.executable, "-m", "atomr.cli", *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return done.stderr.replace("\r", "\n")


def test_a_first_run_says_it_is_compiling_and_a_second_does_not(tmp_path: Path) -> None:
    cache = tmp_path / "numba-cache"  # empty: every kernel must be compiled
    first = _train(tmp_path, cache, "first")
    lines = [line.strip() for line in first.splitlines()]
    assert COMPILING_NOTICE in lines
    before = first[: first.index(COMPILING_NOTICE)]
    assert re.search(r"\| *[1-9][0-9]*/[0-9]+ \[", before) is None, before  # no step counted yet
    second = _train(tmp_path, cache, "second")
    assert COMPILING_NOTICE not in second
