"""`atomr train --metrics PATH --tensorboard DIR`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from atomr.cli import main


def test_the_run_writes_json_lines_and_event_files(tmp_path: Path) -> None:
    pytest.importorskip("tensorboardX", reason="tensorboardX (atomr[tensorboard]) not installed")
    argv = ["train", "--quiet", "--epochs", "1", "--run-dir", str(tmp_path / "run")]
    metrics, board = tmp_path / "m.jsonl", tmp_path / "tb"
    assert main([*argv, "--metrics", str(metrics), "--tensorboard", str(board)]) == 0
    events = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert {e["event"] for e in events} == {"step", "evaluate", "epoch"}
    assert any(board.glob("events.out.tfevents.*"))


def test_a_missing_extra_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    code = main(["train", "--quiet", "--epochs", "1", "--tensorboard", str(tmp_path / "tb")])
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1 and "atomr[tensorboard]" in err
