"""examples/data_parallel.py runs as a script and shows the data-parallel
trainer matching the single-device trainer, with both collectives."""

from __future__ import annotations

import re

import pytest


@pytest.mark.parametrize("collective", ["host", "ring"])
def test_example_data_parallel(collective: str, run_example) -> None:
    stdout = run_example("data_parallel.py", "--collective", collective)
    lines = stdout.splitlines()
    losses = [line for line in lines if line.startswith("step")]
    assert len(losses) == 4
    first = [float(v) for v in re.findall(r"\d+\.\d+", losses[0])]
    last = [float(v) for v in re.findall(r"\d+\.\d+", losses[-1])]
    assert abs(first[0] - first[1]) < 1e-4 and abs(last[0] - last[1]) < 1e-4
    assert last[0] < first[0]  # it trains
    assert f"collective: {collective}" in lines
    assert "replicas identical: True" in lines
    diff = float(re.search(r"difference: (\S+)", stdout).group(1))
    assert diff < 1e-4
    assert lines[-1] == "MATCH"
