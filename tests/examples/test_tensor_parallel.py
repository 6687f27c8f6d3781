"""examples/tensor_parallel.py runs as a script and prints what it promises."""

from __future__ import annotations

import re

from atomr.train import Mlp


def test_tensor_parallel_example(run_example) -> None:
    lines = run_example("tensor_parallel.py").splitlines()
    assert len(lines) == 7, lines
    head = re.fullmatch(r"shards=3 params per shard: \[(\d+), (\d+), (\d+)\] total=(\d+)", lines[0])
    assert head is not None, lines[0]
    per_shard = [int(g) for g in head.groups()[:3]]
    assert sum(per_shard) == int(head.group(4)) == Mlp.param_count([20, 50, 31, 7])
    losses = []
    for i, line in enumerate(lines[1:5]):
        m = re.fullmatch(rf"step {5 * (i + 1)} loss tp=([\d.]+) single=([\d.]+)", line)
        assert m is not None, line
        assert abs(float(m.group(1)) - float(m.group(2))) < 1e-5
        losses.append(float(m.group(1)))
    assert losses[-1] < losses[0]  # it trains
    diff = re.fullmatch(r"max \|tp - single\| weight difference: (\S+)", lines[5])
    assert diff is not None and float(diff.group(1)) < 1e-4
    assert lines[6] == "same weights: True"
