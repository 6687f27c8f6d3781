"""examples/single_device.py runs as a script and prints what it promises."""

from __future__ import annotations

import re

from atomr.train import Mlp


def test_single_device_example(run_example) -> None:
    lines = run_example("single_device.py").splitlines()
    assert len(lines) == 8, lines
    head = re.fullmatch(
        r"train (\d+) samples, test (\d+) samples, model 64-64-10 \((\d+) parameters\)", lines[0]
    )
    assert head is not None, lines[0]
    n_train, n_test, n_params = (int(g) for g in head.groups())
    assert n_train + n_test == 1797
    assert n_params == Mlp.param_count([64, 64, 10])
    losses, accuracies = [], []
    for epoch, line in enumerate(lines[1:6], start=1):
        m = re.fullmatch(rf"epoch {epoch} loss ([\d.]+) test accuracy ([\d.]+)", line)
        assert m is not None, line
        losses.append(float(m.group(1)))
        accuracies.append(float(m.group(2)))
    assert losses[-1] < losses[0] / 3  # it trains
    assert accuracies[-1] > 0.9
    steps_per_epoch = -(-n_train // 32)
    assert lines[6] == f"steps {5 * steps_per_epoch}"
    assert lines[7] == "checkpoint reloaded: same weights True, same test accuracy True"
