"""examples/manual_data_parallel.py runs as a script: a hand-written loop of
weighted all-reduces matches one device on the union of the batches."""

from __future__ import annotations

import re


def test_example_manual_data_parallel(run_example) -> None:  # type: ignore[no-untyped-def]
    stdout = run_example("manual_data_parallel.py")
    lines = stdout.splitlines()
    assert lines[0] == "world size 2: cpu:0, cpu:1"
    steps = [line for line in lines if line.startswith("step")]
    assert len(steps) == 4
    pairs = [[float(v) for v in re.findall(r"\d+\.\d+", line)] for line in steps]
    assert all(abs(a - b) < 1e-4 for a, b in pairs)
    assert pairs[-1][0] < pairs[0][0]  # it trains
    assert "replicas identical: True" in lines
    assert lines[-1] == "MATCH"
