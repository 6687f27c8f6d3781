"""`atomr train --strategy zero --zero-stage K`: sharded data parallel from the
command line; its checkpoint is the full format; `--zero-stage` with another
strategy, or out of range, is one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from atomr.cli import main
from atomr.train import Mlp, load_checkpoint


@pytest.mark.parametrize("stage", ["2", "3"])
def test_zero_trains_and_writes_a_full_checkpoint(stage: str, tmp_path: Path) -> None:
    ckpt = tmp_path / "zero.ckpt"
    argv = ["train", "--quiet", "--strategy", "zero", "--zero-stage", stage, "--epochs", "1"]
    argv += ["--run-dir", str(tmp_path / "run"), "--checkpoint", str(ckpt)]
    assert main(argv) == 0
    saved = load_checkpoint(ckpt)
    assert saved.extra["trainer"] == "ShardedDataParallelTrainer"
    assert saved.extra["stage"] == int(stage)
    assert saved.weights.shape == (Mlp(saved.model["sizes"]).n_params,)
    assert saved.step > 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--strategy", "data", "--zero-stage", "2"], "--zero-stage only applies"),
        (["--strategy", "zero", "--zero-stage", "4"], "--zero-stage"),
    ],
)
def test_bad_zero_flags_are_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", "--quiet", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err.splitlines()[-1]
