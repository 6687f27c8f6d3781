"""examples/parameter_server.py runs as a script and prints what it promises."""

from __future__ import annotations

import re


def test_parameter_server_example(run_example) -> None:
    lines = run_example("parameter_server.py").splitlines()
    batches = -(-1348 // 128)  # digits train split: 1348 samples
    applied = 15 * 4 * batches
    first = re.fullmatch(
        rf"async: epochs=15 applied={applied} avg_staleness=([\d.]+) test_accuracy=([\d.]+)",
        lines[0],
    )
    assert first is not None, lines
    assert float(first.group(2)) >= 0.9
    second = re.fullmatch(
        rf"sync \(2 shards\): epochs=15 applied={applied} "
        rf"versions=\[{applied // 4}, {applied // 4}\] test_accuracy=([\d.]+)",
        lines[1],
    )
    assert second is not None, lines
    assert float(second.group(1)) >= 0.9
