"""examples/sharded_data_parallel.py runs as a script at every stage, trains,
matches one device, and shows each stage's memory: the optimizer state at a
third of one device's, the gradients too from stage 2, the weights from stage 3."""

from __future__ import annotations

import re

import pytest


@pytest.mark.parametrize("stage", ["1", "2", "3"])
def test_example_sharded_data_parallel(stage: str, run_example) -> None:
    stdout = run_example("sharded_data_parallel.py", "--stage", stage)
    lines = stdout.splitlines()
    losses = [
        [float(v) for v in re.findall(r"\d+\.\d+", ln)] for ln in lines if ln.startswith("step")
    ]
    assert len(losses) == 4 and losses[-1][1] < losses[0][1]
    assert all(abs(a - b) < 1e-4 for a, b in losses)
    full = int(re.search(r"holds (\d+) bytes", stdout).group(1))
    replicas = [
        [int(v) for v in re.findall(r"\d+", ln)[1:]] for ln in lines if ln.startswith("replica")
    ]
    assert len(replicas) == 3
    for weights, gradients, optimizer in replicas:
        assert optimizer <= 2 * (full // 3 + 4)
        assert (gradients <= full // 3 + 4) == (stage != "1")
        assert (weights <= full // 3 + 12) == (stage == "3")
    assert lines[-1] == "MATCH"
