"""examples/gpt.py: a GPT trained by every strategy equals one device, step
for step, and generates text."""

from __future__ import annotations

import re

import pytest


@pytest.mark.parametrize("strategy", ["data", "zero", "tensor", "pipeline", "ps"])
def test_example_gpt(strategy: str, run_example) -> None:
    stdout = run_example("gpt.py", "--strategy", strategy)
    lines = stdout.splitlines()
    losses = [
        [float(v) for v in re.findall(r"\d+\.\d+", ln)] for ln in lines if ln.startswith("step")
    ]
    assert len(losses) == 4 and losses[-1][0] < losses[0][0]
    assert all(abs(a - b) < 1e-4 for a, b in losses)
    assert any(ln.startswith("sample: ") for ln in lines)
    assert lines[-1] == "MATCH"
