"""`atomr train --model gpt`: a character-level GPT on the Python
documentation, with the summary, the curves and a generated sample; its
flags are refused with the MLP, and the MLP's data sets with the GPT."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from atomr.cli import main, train_command


def test_a_short_gpt_run_learns_and_prints_a_sample(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    argv = ["train", "--model", "gpt", "--strategy", "data", "--max-steps", "40", "--context", "32"]
    argv += ["--d-model", "32", "--run-dir", str(run), "--lr", "0.01"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "gpt: 2 blocks of width 32, 4 heads, context 32" in out
    assert "sample (temperature 0.8):\nThe " in out
    assert (run / "curves.png").is_file()
    history = json.loads((run / "history.json").read_text())
    assert history["config"]["gpt"]["context"] == 32
    assert "sizes" not in history["config"]  # an Mlp's widths: was [64, 128, vocab]
    assert history["status"] == "reached max_steps"


def test_quiet_prints_one_line_without_the_sample(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--quiet` is "one result line" (getting_started.md); a GPT run added
    its sample's four lines."""
    argv = ["train", "--model", "gpt", "--max-steps", "2", "--context", "8", "--d-model", "8"]
    argv += ["--n-head", "2", "--n-layer", "1", "--quiet", "--run-dir", str(tmp_path)]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("reached max_steps: "), lines


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--n-layer", "3"], "--n-layer only applies to --model gpt"),
        (["--dataset", "pydoc"], "--dataset pydoc is text"),
        (["--model", "gpt", "--dataset", "digits"], "--model gpt trains on --dataset pydoc"),
        (["--model", "gpt", "--n-head", "3"], "must divide --d-model"),
        (["--model", "gpt", "--dropout", "1.5"], "--dropout"),
        (["--model", "gpt", "--loss", "mse"], "cross_entropy"),
        (["--model", "gpt", "--strategy", "tensor", "--devices", "3"], "divides n_head"),
    ],
)
def test_bad_model_flags_are_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["train", "--quiet", "--run-dir", str(tmp_path), *argv]) != 0
    err = capsys.readouterr().err.strip()
    assert message in err.splitlines()[-1]


def test_a_context_longer_than_the_text_can_hold_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """It printed a ValueError traceback (exit 1). (Its attention scores
    cannot fit either: with the memory check, that is the line.)"""
    assert main(["train", "--model", "gpt", "--context", "100000", "--quiet"]) == 1
    assert "this run needs about" in capsys.readouterr().err
    monkeypatch.setattr(train_command, "check_memory", lambda run: None)
    assert main(["train", "--model", "gpt", "--context", "100000", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("atomr: error: --context 100000: ") and "too short" in err
    assert len(err.splitlines()) == 1
