"""examples/pipeline_parallel.py runs as a script and prints what it promises."""

from __future__ import annotations

import re


def test_pipeline_parallel_example(run_example) -> None:
    lines = run_example("pipeline_parallel.py").splitlines()
    losses = [re.findall(r"loss (\d+\.\d+)", line) for line in lines if line.startswith("step")]
    assert len(losses) == 4
    assert all(a == b for a, b in losses)  # pipeline equals single device (5 decimals)
    assert float(losses[-1][0]) < float(losses[0][0])  # and it learns
    diff = next(line for line in lines if line.startswith("max weight difference"))
    assert float(diff.split(":")[1]) < 1e-4
    assert "peak held activations per stage: 3 2 1" in lines
    assert sum(line.startswith("stage ") for line in lines) == 3
    assert any(line.startswith("1f1b: p=3 m=4") for line in lines)
