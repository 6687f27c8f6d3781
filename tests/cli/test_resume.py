"""`--resume` trusts the checkpoint, and its history file only when that file
was written with the same save (its digest): a history file of another save,
empty or corrupt, is ignored with one warning line; a strategy whose steps
per batch vary (a cadence round, local SGD) then cannot resume. Resumes
continue at the batch where the run stopped, and the history file is
written atomically."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import atomr
import atomr.cli
from atomr.cli.dataset import load_dataset
from atomr.cli.errors import CliError
from atomr.cli.history import History, history_path_for
from atomr.cli.parser import build_parser
from atomr.cli.run_config import RunConfig
from atomr.cli.strategies import saved_steps_per_batch
from atomr.cli.training_run import train_epochs
from atomr.train import StepStats, load_checkpoint
from atomr.train.core import Checkpoint, save_checkpoint
from atomr.train.fit import FitCallback, FitPosition, StopFlag
from tests.cli.test_distributed_failures import _save_in_shards


def _run_config(*argv: str) -> RunConfig:
    return RunConfig.from_args(build_parser("test").parse_args(["train", "--quiet", *argv]))


class _OnStep(FitCallback):
    """Calls `action(position)` after every step."""

    def __init__(self, action: Callable[[FitPosition], None]) -> None:
        self.action = action

    def on_step(
        self, position: FitPosition, stats: StepStats, mean_loss: float, rate: float
    ) -> None:
        self.action(position)


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint (and its history file) of a run stopped at epoch 2, batch 5."""
    ckpt = tmp_path_factory.mktemp("stopped") / "run.ckpt"
    run = _run_config("--strategy", "single", "--epochs", "3", "--checkpoint", str(ckpt))
    stop = StopFlag()

    def at(position: FitPosition) -> None:
        if (position.epoch, position.batch) == (1, 5):
            stop.request()

    atomr.run(
        train_epochs(run, load_dataset(run), History(config={}), stop, callbacks=[_OnStep(at)])
    )
    return ckpt


def _resume(ckpt: Path) -> tuple[list[tuple[int, int, int]], History]:
    """Resume `ckpt` to the end of epoch 3; (epoch, batch, step) after each step taken."""
    run = _run_config("--strategy", "single", "--epochs", "3", "--resume", str(ckpt))
    seen: list[tuple[int, int, int]] = []
    history = History(config={})

    def record(p: FitPosition) -> None:
        seen.append((p.epoch, p.batch, p.step))

    atomr.run(
        train_epochs(run, load_dataset(run), history, StopFlag(), callbacks=[_OnStep(record)])
    )
    return seen, history


def _copy(stopped: Path, tmp_path: Path) -> Path:
    ckpt = tmp_path / stopped.name
    shutil.copy(stopped, ckpt)
    shutil.copy(history_path_for(stopped), history_path_for(ckpt))
    return ckpt


def test_an_agreeing_history_file_restores_the_earlier_epochs(
    stopped: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = _copy(stopped, tmp_path)
    seen, history = _resume(ckpt)
    step = load_checkpoint(ckpt).step
    assert seen[0][2] == step + 1
    assert [r.epoch for r in history.epochs] == [1, 2, 3]
    assert "warning" not in capsys.readouterr().err


def _older_step(side: Path) -> None:
    """The history file of an earlier checkpoint (killed before the new one was written)."""
    earlier = History.load(side)
    assert earlier.position is not None
    earlier.position.update(epoch=0, batch=3, step=3, checkpoint="00" * 32)
    earlier.epochs = []
    earlier.save(side)


def _position_set(**fields: object) -> Callable[[Path], None]:
    """A history file of this very save whose position was edited to `fields`."""

    def spoil(side: Path) -> None:
        earlier = History.load(side)
        assert earlier.position is not None
        earlier.position.update(fields)
        earlier.save(side)

    return spoil


def _raw_set(where: str, key: str, value: object) -> Callable[[Path], None]:
    """A history file of this very save whose JSON has `key` of its top
    level (`where` ""), or of its first epoch record ("epochs"), set to `value`."""

    def spoil(side: Path) -> None:
        data = json.loads(side.read_text())
        (data["epochs"][0] if where == "epochs" else data)[key] = value
        side.write_text(json.dumps(data))

    return spoil


@pytest.mark.parametrize(
    ("spoil", "why"),
    [
        (_older_step, "another save of the checkpoint (step 3"),
        (_position_set(epoch=-1), "not whole numbers within the run"),
        (_position_set(batch=100), "not whole numbers within the run"),
        (_position_set(step=-5), "not whole numbers within the run"),
        (_position_set(epoch=1.7), "not whole numbers within the run"),
        (_position_set(epoch="1"), "not whole numbers within the run"),
        (_position_set(batch=True), "not whole numbers within the run"),
        (lambda side: side.write_text(""), "not an atomr history file"),
        (lambda side: side.write_text('{"format": "atomr-hist'), "not an atomr history file"),
        # a RecursionError out of `atomr train` before
        (lambda side: side.write_text("[" * 100_000), "not an atomr history file"),
        # a TypeError, a ValueError from NumPy and an OverflowError out of `atomr train` before
        (_raw_set("epochs", "epoch", "x"), "not an atomr history file"),
        (_raw_set("epochs", "test_accuracy", [1]), "not an atomr history file"),
        (_raw_set("", "wall_seconds", 10**400), "not an atomr history file"),
    ],
    ids=[
        "older-step",
        "negative-epoch",
        "batch-past-the-epoch",
        "negative-step",
        "fractional-epoch",
        "text-epoch",
        "bool-batch",
        "empty",
        "corrupt",
        "nested-too-deep",
        "text-epoch-record",
        "list-accuracy",
        "wall-seconds-beyond-float",
    ],
)
def test_the_checkpoint_step_wins_over_a_bad_history_file(
    stopped: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    spoil: Callable[[Path], None],
    why: str,
) -> None:
    ckpt = _copy(stopped, tmp_path)
    spoil(history_path_for(ckpt))
    seen, history = _resume(ckpt)
    step = load_checkpoint(ckpt).step
    steps_per_epoch = step - 5  # stopped at epoch 2 (index 1), batch 5
    assert seen[0] == (1, 6, step + 1)  # no replayed batch, no skipped one
    assert seen[-1][2] == 3 * steps_per_epoch
    assert [r.epoch for r in history.epochs] == [2, 3]  # epoch 1's record is lost, not faked
    lines = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(lines) == 1
    assert lines[0].startswith("atomr: warning: --resume: ignoring ")
    assert why in lines[0]


def test_history_save_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write that fails half-way leaves the previous file whole, and no temp file."""
    path = tmp_path / "h.json"
    History(config={"a": 1}).save(path)
    before = path.read_text()

    def fail(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(OSError):
        History(config={"a": 2}, status="finished").save(path)
    assert path.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h.json"]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (
            ["--optimizer", "sgd"],
            "trained with --optimizer adam, not sgd; resume with --optimizer adam",
        ),
        (["--model", "gpt"], "is of a --model mlp model, not --model gpt; resume with --model mlp"),
        (["--max-steps", "10"], "at or past --max-steps 10; pass a larger --max-steps"),
        (["--lr-schedule", "cosine"], "learning-rate schedule is none, this run's cosine (eta_min"),
        (
            ["--loss", "mse"],
            "trained with --loss cross_entropy, not mse; resume with --loss cross_entropy",
        ),
    ],
    ids=["optimizer", "model", "max-steps", "lr-schedule", "loss"],
)
def test_a_resume_that_cannot_continue_says_which_option_to_change(
    stopped: Path, capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    code = atomr.cli.main(
        [
            "train",
            "--quiet",
            "--strategy",
            "single",
            "--epochs",
            "3",
            "--resume",
            str(stopped),
            *argv,
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert needle in err and "{'" not in err  # words, not the config's dict


def test_a_checkpoint_holding_a_number_beyond_floats_range_is_one_line(
    stopped: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = load_checkpoint(stopped)
    kind = {**saved.optimizer["kind"], "lr": 10**400}  # valid JSON; was an OverflowError
    bad = tmp_path / "big.ckpt"
    save_checkpoint(bad, dataclasses.replace(saved, optimizer={**saved.optimizer, "kind": kind}))
    argv = ["train", "--quiet", "--strategy", "single", "--epochs", "3", "--resume", str(bad)]
    assert atomr.cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--resume:" in err and "optimizer.kind.lr" in err, err


def test_a_directory_given_to_resume_is_named_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert atomr.cli.main(["train", "--quiet", "--resume", str(tmp_path)]) == 2
    assert "is a directory, not a checkpoint file" in capsys.readouterr().err


VARYING_STEPS = [
    ("--strategy", "ps", "--workers", "2"),
    ("--strategy", "data", "--policy", "async"),
    ("--strategy", "data", "--policy", "cadence"),
]


def _stop_at_epoch_2_batch_5(ckpt: Path, strategy: tuple[str, ...]) -> None:
    run = _run_config(*strategy, "--epochs", "2", "--checkpoint", str(ckpt))
    stop = StopFlag()

    def at(position: FitPosition) -> None:
        if (position.epoch, position.batch) == (1, 5):
            stop.request()

    history = History(config={})
    atomr.run(train_epochs(run, load_dataset(run), history, stop, callbacks=[_OnStep(at)]))
    assert history.status == "interrupted"


@pytest.mark.parametrize("strategy", VARYING_STEPS, ids=["ps", "local-sgd", "cadence"])
def test_a_strategy_of_varying_steps_per_batch_resumes_at_the_batch_it_stopped(
    tmp_path: Path, strategy: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    """Its checkpoint's step is not one per batch (a parameter server counts
    every worker's gradient): the position comes from the history file
    written with that very save."""
    ckpt = tmp_path / "run.ckpt"
    _stop_at_epoch_2_batch_5(ckpt, strategy)
    run = _run_config(*strategy, "--epochs", "2", "--resume", str(ckpt))
    seen: list[tuple[int, int]] = []
    history = History(config={})
    record = _OnStep(lambda p: seen.append((p.epoch, p.batch)))
    atomr.run(train_epochs(run, load_dataset(run), history, StopFlag(), callbacks=[record]))
    assert seen[0] == (1, 6)  # no replayed batch, no skipped one
    assert [r.epoch for r in history.epochs] == [1, 2]
    assert "warning" not in capsys.readouterr().err
    history_path_for(ckpt).unlink()
    if strategy[1] == "ps":  # without its history file: each batch is one step per worker
        seen.clear()  # (the checkpoint's 2 workers, whatever this run's --workers)
        run = _run_config(
            "--strategy", "ps", "--workers", "3", "--epochs", "2", "--resume", str(ckpt)
        )
        atomr.run(
            train_epochs(run, load_dataset(run), History(config={}), StopFlag(), callbacks=[record])
        )
        assert seen[0] == (1, 6)
        seen.clear()  # another strategy: the checkpoint's steps per batch still count
        run = _run_config("--strategy", "single", "--epochs", "2", "--resume", str(ckpt))
        atomr.run(
            train_epochs(run, load_dataset(run), History(config={}), StopFlag(), callbacks=[record])
        )
        assert seen[0] == (1, 6)
        return
    # a cadence round or local SGD: the checkpoint's step says nothing, refused,
    # under its own strategy or another
    for argv in (strategy, ("--strategy", "single")):
        run = _run_config(*argv, "--epochs", "2", "--resume", str(ckpt))
        with pytest.raises(atomr.cli.CliError, match="history file"):
            atomr.run(train_epochs(run, load_dataset(run), History(config={}), StopFlag()))


def test_a_history_file_from_before_digests_and_the_loss_matches_by_step(
    stopped: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = _copy(stopped, tmp_path)
    side = history_path_for(ckpt)
    older = History.load(side)
    assert older.position is not None
    del older.position["checkpoint"]
    del older.position["loss"]  # nor the loss, nor a config: it is not checked then
    older.save(side)
    seen, history = _resume(ckpt)
    assert seen[0][2] == load_checkpoint(ckpt).step + 1
    assert [r.epoch for r in history.epochs] == [1, 2, 3]
    assert "warning" not in capsys.readouterr().err


def test_a_history_file_from_before_the_loss_was_recorded_checks_its_config_loss(
    stopped: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A history file written before its position recorded the loss still
    holds it among the run's options (`config`): `--resume --loss mse` of a
    cross_entropy run was accepted unchecked, and trained on with mse."""
    ckpt = _copy(stopped, tmp_path)
    side = history_path_for(ckpt)
    older = History.load(side)
    assert older.position is not None
    del older.position["loss"]
    older.config = _run_config("--strategy", "single", "--epochs", "3").to_json()
    assert older.config["loss"] == "cross_entropy"
    older.save(side)
    argv = ["train", "--quiet", "--strategy", "single", "--epochs", "3", "--resume", str(ckpt)]
    argv += ["--loss", "mse", "--run-dir", str(tmp_path / "run")]
    assert atomr.cli.main(argv) == 2
    assert capsys.readouterr().err.strip() == (
        "atomr: error: --resume: the checkpoint was trained with --loss cross_entropy, not "
        "mse; resume with --loss cross_entropy (the loss is part of the run it continues)"
    )
    assert not (tmp_path / "run").exists()


def test_a_parameter_server_checkpoint_at_its_step_limit_is_not_resumed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--max-steps counts the trainer's own steps: a parameter server's, one
    per worker per batch, not the batches."""
    ckpt = tmp_path / "ps.ckpt"
    argv = ["train", "--quiet", "--strategy", "ps", "--workers", "2", "--max-steps", "4"]
    argv += ["--run-dir", str(tmp_path / "run")]  # not ./atomr-runs of the folder it runs in
    assert atomr.cli.main([*argv, "--checkpoint", str(ckpt)]) == 0
    assert load_checkpoint(ckpt).step == 4
    capsys.readouterr()
    assert atomr.cli.main([*argv, "--resume", str(ckpt)]) == 2
    assert "at step 4, at or past --max-steps 4" in capsys.readouterr().err


def test_a_sharded_save_is_checked_against_the_options_by_its_shard_files(
    stopped: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its index holds no optimizer settings: a resume with another --lr was
    accepted without a word (the shards' optimizer state then won)."""
    index = tmp_path / "sharded.ckpt"
    _save_in_shards(stopped, index, 0.0)
    argv = ["train", "--quiet", "--strategy", "zero", "--epochs", "3", "--resume", str(index)]
    assert atomr.cli.main([*argv, "--lr", "0.5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "atomr: error: --resume: the checkpoint was trained with --lr 0.005, not 0.5; resume "
        "with --lr 0.005 (a checkpoint keeps its optimizer's hyper-parameters)"
    )
    assert atomr.cli.main([*argv, "--run-dir", str(tmp_path / "run")]) == 0


@pytest.mark.parametrize("workers", [True, 2.0, 0, -3, 10**30, "2"])
def test_a_checkpoint_naming_no_count_of_workers_is_refused_naming_it(workers: object) -> None:
    """A parameter-server checkpoint's `workers` sets how many steps a batch
    took. Before, `True` was read as 1 worker and 10**30 as that many, and
    the resume then failed with a message about steps that vary."""
    run = _run_config("--strategy", "ps", "--devices", "2")
    ckpt = Checkpoint(
        model={}, weights=np.zeros(1), step=4, extra={"trainer": "AsyncParameterServer"}
    )
    assert saved_steps_per_batch(run, ckpt) == 2  # no count saved: this run's workers
    ckpt.extra["workers"] = 4
    assert saved_steps_per_batch(run, ckpt) == 4
    ckpt.extra["workers"] = workers
    with pytest.raises(CliError, match=r"^--resume: the checkpoint's workers must be"):
        saved_steps_per_batch(run, ckpt)
