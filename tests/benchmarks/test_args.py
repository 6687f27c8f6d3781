"""The benchmark scripts (run as docs/benchmarks.md and docs/reliability.md
say, or through `atomr bench -- ...`) refuse a count or a duration they
cannot run with one usage line (exit 2), by `benchmarks/_args.py`'s types:
it was a traceback from deep inside a run (`ValueError: negative count`,
`no median for empty data`, `min() arg is an empty sequence`, ...)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COUNT = "must be >= 1, got {}"
REAL = "must be positive and finite, got {}"
FACTOR = "must be finite and >= 1, got {}"


@pytest.mark.parametrize(
    ("script", "option", "value", "rule"),
    [
        ("soak.py", "--scale", "-1", REAL),
        ("soak.py", "--scale", "nan", REAL),
        ("soak.py", "--scale", "0", REAL),
        ("data_parallel.py", "--repeat", "-1", COUNT),
        ("gpt.py", "--repeat", "0", COUNT),
        ("parameter_server.py", "--workers", "-1", COUNT),
        ("pipeline.py", "--op-ms", "-1", REAL),
        ("tensor_parallel.py", "--shards", "-1", COUNT),
        ("thread_hop.py", "--hops", "-1", COUNT),
        ("train_step.py", "--batch", "-1", COUNT),
        ("train_step.py", "--sizes", "-1", COUNT),
        ("policies.py", "--slow", "-1", FACTOR),
        ("policies.py", "--slow", "0.5", FACTOR),
        ("policies.py", "--slow", "inf", FACTOR),
        ("zero.py", "--rounds", "-1", COUNT),
    ],
)
def test_a_value_it_cannot_run_with_is_one_usage_line(
    script: str, option: str, value: str, rule: str
) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), option, value],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    shown = float(value) if rule != COUNT else int(value)
    expected = f"{script}: error: argument {option}: {rule.format(shown)}"
    assert result.stderr.splitlines()[-1] == expected, result.stderr


@pytest.mark.parametrize(
    ("script", "option", "value", "message"),
    [
        ("train_step.py", "--sizes", "784,0,10", "must be >= 1, got 0"),
        ("train_step.py", "--sizes", "784", "needs two or more widths (input and output)"),
        ("kernels.py", "--only", "-1", "unknown name '-1': choose among matmul, "),
        ("kernels.py", "--only", "adam,", "unknown name '': choose among "),
    ],
)
def test_a_list_it_cannot_run_with_is_one_usage_line(
    script: str, option: str, value: str, message: str
) -> None:
    """A layer width below 1 or a lone one ended in a traceback; a kernel
    name that is none of them ran nothing, without a word."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), f"{option}={value}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert result.stderr.splitlines()[-1].startswith(
        f"{script}: error: argument {option}: {message}"
    ), result.stderr
