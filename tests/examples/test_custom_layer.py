"""examples/custom_layer.py: a user's own layer passes the gradient check and
trains with data parallel as on one device."""

from __future__ import annotations

import re


def test_example_custom_layer(run_example) -> None:
    stdout = run_example("custom_layer.py")
    lines = stdout.splitlines()
    error = float(re.search(r"finite differences (\S+)", stdout).group(1))
    assert error < 1e-6
    losses = [
        [float(v) for v in re.findall(r"\d+\.\d+", ln)] for ln in lines if ln.startswith("step")
    ]
    assert len(losses) == 5 and losses[-1][0] < losses[0][0]
    assert all(abs(a - b) < 1e-5 for a, b in losses)
    assert lines[-1] == "MATCH"
