"""`atomr train --metrics PATH --tensorboard DIR`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from atomr.cli import main
from tests.train.full_disk import (
    ENOSPC,
    json_lines_fill_after,
    tensorboard_fills_after,
    within,
)


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
    assert code == 1 and len(err.splitlines()) == 1 and "pip install -e '.[tensorboard]'" in err


@pytest.mark.parametrize("option", ["--metrics", "--tensorboard"])
def test_a_metrics_log_on_a_full_disk_fails_the_run_in_one_line_and_keeps_the_training(
    option: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A full disk under --metrics ended the run with '[Errno 28] No space left
    on device', naming no option, with no checkpoint and no history; under
    --tensorboard the run hung for good."""
    if option == "--metrics":
        json_lines_fill_after(monkeypatch, 4000)
        target, reason = tmp_path / "m.jsonl", "No space left on device"
    else:
        pytest.importorskip(
            "tensorboardX", reason="tensorboardX (atomr[tensorboard]) not installed"
        )
        tensorboard_fills_after(monkeypatch, 1)  # the file's header, then the disk is full
        target, reason = tmp_path / "tb", "the TensorBoard writer stopped"
    ckpt, run = tmp_path / "c.ckpt", tmp_path / "run"
    argv = ["train", "--quiet", "--epochs", "2", "--run-dir", str(run), "--checkpoint", str(ckpt)]
    codes: list[int] = []
    assert within(120, lambda: codes.append(main([*argv, option, str(target)]))) is None
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert codes == [1] and err.startswith(
        f"atomr: error: training failed: cannot write {option} {target}: {reason}"
    )
    assert f"checkpoint at the last good step in {ckpt}" in err
    assert json.loads((run / "history.json").read_text())["status"] == "failed"
    position = json.loads(Path(f"{ckpt}.history.json").read_text())["position"]
    assert position["step"] > 0  # saved where the run stopped
    monkeypatch.undo()
    again = ["train", "--quiet", "--epochs", "2", "--run-dir", str(tmp_path / "again")]
    assert main([*again, "--resume", str(ckpt)]) == 0


def test_a_checkpoint_history_that_cannot_be_written_fails_the_run_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The history beside the checkpoint failing to write (a full disk) was a
    bare 'atomr: error: [Errno 28] No space left on device' naming no file,
    and the run's own history was not written."""
    from atomr.cli import history as history_module

    real_write = history_module.write_atomically

    def write(target: Path, data: bytes) -> None:
        if target.name.endswith(".ckpt.history.json"):
            raise OSError(ENOSPC.errno, ENOSPC.strerror, f".{target.name}.tmp")
        real_write(target, data)

    monkeypatch.setattr(history_module, "write_atomically", write)
    ckpt, run = tmp_path / "c.ckpt", tmp_path / "run"
    argv = ["train", "--quiet", "--epochs", "2", "--run-dir", str(run), "--checkpoint", str(ckpt)]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    side = f"{ckpt}.history.json"
    assert err.startswith(
        f"atomr: error: training failed: cannot write the checkpoint's history {side}: "
        "No space left on device; the checkpoint in "
    ), err
    written = json.loads((run / "history.json").read_text())
    assert written["status"] == "failed" and [e["epoch"] for e in written["epochs"]] == [1]
    assert not Path(side).exists()
    monkeypatch.undo()
    again = ["train", "--quiet", "--epochs", "2", "--run-dir", str(tmp_path / "again")]
    assert main([*again, "--resume", str(ckpt)]) == 0  # from the checkpoint's step
