"""`atomr train` end to end on digits: every strategy learns, and writes a
valid PNG and a JSON history; `--resume` continues where a checkpoint left."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atomr.cli import main
from atomr.train import load_checkpoint

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _train(tmp_path: Path, *argv: str) -> tuple[dict[str, Any], Path]:
    code = main(["train", "--quiet", "--run-dir", str(tmp_path / "run"), *argv])
    assert code == 0
    return _outputs(tmp_path / "run")


def _outputs(run_dir: Path) -> tuple[dict[str, Any], Path]:
    history = json.loads((run_dir / "history.json").read_text())
    png = run_dir / "curves.png"
    assert png.read_bytes()[:8] == PNG_MAGIC
    assert png.stat().st_size > 10_000  # two plotted axes, not an empty file
    return history, png


def _check_history(history: dict[str, Any], strategy: str, epochs: int) -> None:
    assert history["format"] == "atomr-history/1"
    assert history["status"] == "finished"
    assert history["config"]["strategy"] == strategy
    assert history["config"]["dataset"] == "digits"
    records = history["epochs"]
    assert [r["epoch"] for r in records] == list(range(1, epochs + 1))
    steps = [r["step"] for r in records]
    assert steps == [steps[0] * (i + 1) for i in range(epochs)]  # same steps every epoch
    for r in records:
        for key in ("train_loss", "test_loss", "train_accuracy", "test_accuracy"):
            assert isinstance(r[key], float)
        assert r["samples_per_s"] > 0
    assert records[-1]["train_loss"] < records[0]["train_loss"]


def test_default_command_trains_data_parallel_on_digits(tmp_path: Path) -> None:
    """`atomr train` with no arguments: data parallel over 2 logical CPUs,
    progress bar, summary table, files in ./atomr-runs/<name>/."""
    result = subprocess.run(
        [sys.executable, "-m", "atomr.cli", "train"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    runs = list((tmp_path / "atomr-runs").iterdir())
    assert len(runs) == 1 and runs[0].name.endswith("-data")
    history, _ = _outputs(runs[0])
    _check_history(history, "data", 20)
    assert history["config"]["devices"] == ["cpu:0", "cpu:1"]
    assert history["epochs"][-1]["test_accuracy"] >= 0.95
    # the progress bar and the per-epoch lines go to stderr, the table to stdout
    assert "epoch 20/20" in result.stderr and "samples_s=" in result.stderr
    assert "step/s" in result.stderr
    assert "atomr train: summary" in result.stdout
    assert re.search(r"^test accuracy +\d+\.\d+ %$", result.stdout, re.MULTILINE)
    assert re.search(r"^status +finished$", result.stdout, re.MULTILINE)


@pytest.mark.parametrize(
    ("strategy", "extra", "threshold"),
    [
        ("single", [], 0.95),
        ("tensor", [], 0.95),
        ("pipeline", ["--schedule", "gpipe"], 0.95),
        ("pipeline", ["--schedule", "1f1b"], 0.95),
        ("ps", [], 0.93),
    ],
)
def test_every_strategy_learns_digits(
    tmp_path: Path, strategy: str, extra: list[str], threshold: float
) -> None:
    history, _ = _train(tmp_path, "--strategy", strategy, *extra)
    _check_history(history, strategy, 20)
    assert history["epochs"][-1]["test_accuracy"] >= threshold


def test_plot_and_history_paths_and_mse(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plot, hist = tmp_path / "a" / "c.png", tmp_path / "b" / "h.json"
    code = main(
        [
            "train",
            "--strategy",
            "single",
            "--epochs",
            "3",
            "--loss",
            "mse",
            "--optimizer",
            "sgd",
            "--plot",
            str(plot),
            "--history",
            str(hist),
            "--quiet",
        ]
    )
    assert code == 0
    assert plot.read_bytes()[:8] == PNG_MAGIC
    history = json.loads(hist.read_text())
    assert history["config"]["loss"] == "mse"
    # MSE has no accuracy of its own: the CLI computes it from the weights
    assert history["epochs"][-1]["test_accuracy"] > 0.5
    out = capsys.readouterr().out.strip()
    assert out.startswith("finished: test accuracy ")


def test_resume_continues_epochs_and_steps(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt" / "digits.ckpt"
    first, _ = _train(
        tmp_path / "a", "--strategy", "data", "--epochs", "2", "--checkpoint", str(ckpt)
    )
    steps_per_epoch = first["epochs"][0]["step"]
    assert ckpt.is_file() and (tmp_path / "ckpt" / "digits.ckpt.history.json").is_file()
    # resume into another strategy: checkpoints are interchangeable
    resumed_ckpt = tmp_path / "resumed.ckpt"
    second, _ = _train(
        tmp_path / "b",
        "--strategy",
        "single",
        "--epochs",
        "4",
        "--resume",
        str(ckpt),
        "--checkpoint",
        str(resumed_ckpt),
    )
    assert second["resumed_from"] == str(ckpt)
    assert [r["epoch"] for r in second["epochs"]] == [1, 2, 3, 4]
    assert [r["step"] for r in second["epochs"]] == [steps_per_epoch * e for e in (1, 2, 3, 4)]
    assert second["epochs"][:2] == first["epochs"]  # the earlier records are kept
    assert second["position"]["step"] == 4 * steps_per_epoch

    # the resumed run continued from the saved weights and optimizer state:
    # it ends where an uninterrupted 4-epoch run with the same seed ends
    # (data parallel and single differ only by float rounding, ~1e-7)
    straight_ckpt = tmp_path / "straight.ckpt"
    straight, _ = _train(
        tmp_path / "c", "--strategy", "single", "--epochs", "4", "--checkpoint", str(straight_ckpt)
    )
    resumed, uninterrupted = load_checkpoint(resumed_ckpt), load_checkpoint(straight_ckpt)
    assert resumed.step == uninterrupted.step == 4 * steps_per_epoch
    np.testing.assert_allclose(resumed.weights, uninterrupted.weights, rtol=0, atol=1e-5)
    for key in ("train_loss", "test_loss", "test_accuracy"):
        got = [r[key] for r in second["epochs"][2:]]
        want = [r[key] for r in straight["epochs"][2:]]
        np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=key)


def test_resume_of_a_finished_checkpoint_says_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = tmp_path / "c.ckpt"
    _train(tmp_path, "--strategy", "single", "--epochs", "1", "--checkpoint", str(ckpt))
    capsys.readouterr()
    code = main(
        [
            "train",
            "--strategy",
            "single",
            "--epochs",
            "1",
            "--resume",
            str(ckpt),
            "--run-dir",
            str(tmp_path / "again"),
        ]
    )
    assert code == 2
    assert capsys.readouterr().err.strip() == (
        "atomr: error: --resume: the checkpoint has finished 1 epoch(s); "
        "pass --epochs greater than 1 to train further"
    )


def test_resume_with_other_data_options_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = tmp_path / "c.ckpt"
    _train(tmp_path, "--strategy", "single", "--epochs", "1", "--checkpoint", str(ckpt))
    capsys.readouterr()
    code = main(
        [
            "train",
            "--strategy",
            "single",
            "--epochs",
            "2",
            "--batch-size",
            "16",
            "--resume",
            str(ckpt),
            "--run-dir",
            str(tmp_path / "again"),
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert err == (  # it showed both option dicts, leaving the user to diff them
        "atomr: error: --resume: the checkpoint was made with --batch-size 32 (not 16); "
        "resume with --batch-size 32 (the data and its order must be the checkpoint's)\n"
    )


def test_synthetic_dataset_of_any_size(tmp_path: Path) -> None:
    history, _ = _train(
        tmp_path,
        "--strategy",
        "single",
        "--dataset",
        "synthetic",
        "--samples",
        "500",
        "--features",
        "12",
        "--classes",
        "3",
        "--epochs",
        "2",
        "--hidden",
        "16,8",
    )
    assert history["config"]["sizes"] == [12, 16, 8, 3]
    assert history["epochs"][-1]["step"] == 2 * (400 // 32 + 1)


@pytest.mark.parametrize(
    ("first", "again", "needle"),
    [
        (["--optimizer", "sgd", "--lr", "0.05"], ["--optimizer", "sgd", "--lr", "0.01"], "--lr"),
        (
            ["--optimizer", "sgd", "--momentum", "0.9"],
            ["--optimizer", "sgd", "--momentum", "0.5"],
            "--momentum",
        ),
    ],
)
def test_resume_with_other_optimizer_options_is_refused(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    first: list[str],
    again: list[str],
    needle: str,
) -> None:
    """A checkpoint carries its optimizer's hyper-parameters and loading it
    restores them (as torch's `load_state_dict`), so a different `--lr`
    or `--momentum` on resume would be silently ignored (and recorded
    wrongly in the history): it is refused instead."""
    ckpt = tmp_path / "c.ckpt"
    _train(tmp_path, "--strategy", "single", "--epochs", "1", "--checkpoint", str(ckpt), *first)
    capsys.readouterr()
    argv = ["train", "--strategy", "single", "--epochs", "2", "--resume", str(ckpt)]
    code = main([*argv, "--run-dir", str(tmp_path / "again"), *again])
    assert code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("atomr: error: --resume: ") and needle in err
    # the same options resume fine
    assert main([*argv, "--run-dir", str(tmp_path / "same"), "--quiet", *first]) == 0


def test_resume_with_another_model_says_which_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = tmp_path / "c.ckpt"
    first = ["--strategy", "single", "--epochs", "1", "--hidden", "32,16", "--activation", "tanh"]
    _train(tmp_path, *first, "--checkpoint", str(ckpt))
    capsys.readouterr()
    argv = ["train", "--strategy", "single", "--epochs", "2", "--resume", str(ckpt)]
    code = main([*argv, "--run-dir", str(tmp_path / "again")])
    assert code == 2
    assert capsys.readouterr().err == (
        "atomr: error: --resume: the checkpoint is of a 64-32-16-10 tanh model, not 64-128-10 "
        "relu; resume with --hidden 32,16 --activation tanh\n"
    )


def test_resume_of_a_model_without_hidden_layers_says_the_cli_cannot_build_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from atomr.train.core import Checkpoint, save_checkpoint

    ckpt = tmp_path / "linear.ckpt"
    model = {"sizes": [64, 10], "activation": "relu"}
    save_checkpoint(ckpt, Checkpoint(model, np.zeros(64 * 10 + 10, dtype=np.float32), 1))
    argv = ["train", "--strategy", "single", "--epochs", "2", "--resume", str(ckpt)]
    assert main([*argv, "--run-dir", str(tmp_path / "again")]) == 2
    err = capsys.readouterr().err
    assert "the checkpoint is of a 64-10 relu model" in err
    assert "the command line always builds a hidden layer" in err


def test_a_diverging_run_says_so_in_one_line_and_keeps_its_history(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It printed an 18-frame traceback and wrote no history or plot."""
    ckpt = tmp_path / "div.ckpt"
    argv = ["--strategy", "single", "--optimizer", "sgd", "--lr", "1e10", "--epochs", "2"]
    code = main(
        ["train", "--quiet", "--run-dir", str(tmp_path / "run"), "--checkpoint", str(ckpt), *argv]
    )
    assert code == 1
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1
    assert err.startswith("atomr: error: training failed: loss is not finite")
    assert "lower --lr or add --clip" in err and str(ckpt) in err
    history = json.loads((tmp_path / "run" / "history.json").read_text())
    assert history["status"] == "failed"
    assert (tmp_path / "run" / "curves.png").read_bytes().startswith(PNG_MAGIC)


def test_another_rank_failing_is_one_line_on_this_rank(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under --distributed the ranks whose trainer started get
    OtherProcessFailed when another rank's did not (the failing rank shows
    its own error): it printed a traceback, as for a bug."""
    from atomr.cli import training_run
    from atomr.train.core import OtherProcessFailed

    async def other_rank_failed(*args: Any) -> Any:
        raise OtherProcessFailed("process rank 1 failed to start its trainer")

    monkeypatch.setattr(training_run, "spawn_trainer", other_rank_failed)
    code = main(["train", "--quiet", "--epochs", "1", "--run-dir", str(tmp_path / "run")])
    assert code == 1
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith("atomr: error: training failed: process rank 1 failed to start"), err
    assert json.loads((tmp_path / "run" / "history.json").read_text())["status"] == "failed"
