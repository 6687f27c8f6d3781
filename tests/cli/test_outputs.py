"""Output paths are checked against each other and probed with a real write
before any training: clashes, a non-PNG `--plot`, a `--name` leaving the runs
folder, EPERM and EIO all fail at once in one line."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from atomr.cli import CliError, main, train_command
from atomr.cli.parser import build_parser
from atomr.train.fit import StopFlag


@pytest.fixture
def no_training(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object) -> None:
        raise AssertionError("training started before the outputs were checked")

    monkeypatch.setattr(train_command, "load_dataset", refuse)


def _one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str], code: int) -> str:
    assert main(["train", "--quiet", "--epochs", "1", *argv]) == code
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert out == "" and len(lines) == 1 and lines[0].startswith("atomr: error: "), err
    return lines[0]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--checkpoint", "X", "--history", "X"], "--checkpoint X is the same file as --history"),
        (
            ["--checkpoint", "X.png", "--plot", "X.png"],
            "--checkpoint X.png is the same file as --plot",
        ),
        (["--plot", "X.png", "--history", "X.png"], "--history X.png is the same file as --plot"),
        (["--plot", "X.png", "--history", "./d/../X.png"], "is the same file as --plot"),
        (["--checkpoint", "c", "--history", "c.history.json"], "is the same file as --history"),
        (["--resume", "R", "--history", "R"], "--history R is the same file as --resume"),
        (["--resume", "R", "--metrics", "R"], "--metrics R is the same file as --resume"),
        (["--checkpoint", "c", "--metrics", "c"], "--metrics c is the same file as --checkpoint"),
        (["--history", "h", "--tensorboard", "h"], "--tensorboard h is the same file as --history"),
        (["--checkpoint", "o", "--run-dir", "o"], "--run-dir o/curves.png would be inside"),
        (["--checkpoint", "o", "--plot", "o/p.png"], "--plot o/p.png would be inside the file"),
        (["--metrics", "m", "--tensorboard", "m/tb"], "--tensorboard m/tb would be inside"),
        (["--plot", "out.txt"], "--plot writes a PNG: give a path ending in .png"),
        (["--name", ".."], "--name must be a plain file name inside the runs folder"),
        (["--name", "."], "--name must be a plain file name inside the runs folder"),
        (["--name", "../elsewhere"], "--name must be a plain file name inside the runs folder"),
    ],
)
def test_clashing_or_misnamed_outputs_are_refused(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    no_training: None,
    argv: list[str],
    needle: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d").mkdir()
    (tmp_path / "R").write_bytes(b"a checkpoint, not read: the outputs are checked first")
    line = _one_line_error(capsys, argv, 2)
    assert needle in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["R", "d"]  # nothing written


def test_resume_may_continue_into_its_own_checkpoint(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_training: None
) -> None:
    """`--resume c --checkpoint c` is allowed: the outputs check lets it through."""
    (tmp_path / "c").write_bytes(b"x")
    with pytest.raises(AssertionError, match="training started"):
        main(
            [
                "train",
                "--quiet",
                "--resume",
                str(tmp_path / "c"),
                "--checkpoint",
                str(tmp_path / "c"),
                "--run-dir",
                str(tmp_path / "run"),
            ]
        )


def test_an_output_that_fails_with_eio_is_refused_before_training(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    no_training: None,
) -> None:
    """A disk that fails writes (EIO on sync) is found by the probe, not after the run."""

    def eio(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fsync", eio)
    line = _one_line_error(capsys, ["--run-dir", str(tmp_path / "run")], 1)
    assert "--run-dir: cannot write " in line and os.strerror(errno.EIO) in line
    assert list(tmp_path.iterdir()) == []  # the probe file is gone


def test_an_immutable_output_fails_with_eperm_before_training(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, no_training: None
) -> None:
    """`chattr +i` makes even root's writes fail with EPERM (where supported)."""
    target = tmp_path / "history.json"
    target.write_text("{}")
    chattr = shutil.which("chattr")
    if (
        chattr is None
        or subprocess.run([chattr, "+i", str(target)], capture_output=True).returncode
    ):
        pytest.skip("this file system cannot make a file immutable (chattr +i)")
    try:
        argv = ["--history", str(target), "--run-dir", str(tmp_path / "run")]
        line = _one_line_error(capsys, argv, 1)
    finally:
        subprocess.run([chattr, "-i", str(target)], check=True)
    assert line.startswith(f"atomr: error: --history: cannot write {target}: ")
    assert os.strerror(errno.EPERM) in line


def test_a_folder_given_for_a_file_output_is_named_so(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, no_training: None
) -> None:
    """Not "--run-dir .../curves.png would be inside the file of --metrics"."""
    argv = ["--metrics", str(tmp_path), "--run-dir", str(tmp_path / "run")]
    line = _one_line_error(capsys, argv, 1)
    assert f"--metrics: cannot write {tmp_path}: it is a directory" in line


def test_a_plot_stopped_while_drawing_leaves_the_previous_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while matplotlib writes the curves: the PNG that was there stays
    whole (it used to be written in place, so a stop left a torn file)."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from atomr.cli.history import History
    from atomr.cli.plotting import save_curves

    target = tmp_path / "curves.png"
    target.write_bytes(b"previous")

    def torn_savefig(self: Figure, fname: object, **kwargs: object) -> None:
        if isinstance(fname, str | os.PathLike):
            Path(fname).write_bytes(b"\x89PNG torn")
        else:
            fname.write(b"\x89PNG torn")  # type: ignore[attr-defined]
        raise KeyboardInterrupt

    monkeypatch.setattr(Figure, "savefig", torn_savefig)
    with pytest.raises(KeyboardInterrupt):
        save_curves(History(config={}), target)
    assert target.read_bytes() == b"previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["curves.png"]
    monkeypatch.undo()
    save_curves(History(config={}), target)
    assert target.read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize("blocked", ["file", "file/tb"])
def test_a_tensorboard_folder_that_cannot_be_made_is_refused_before_training(
    blocked: str, capsys: pytest.CaptureFixture[str], tmp_path: Path, no_training: None
) -> None:
    """It was found only once the logs were opened, after the data set was
    loaded (and, under --distributed, after the ranks agreed)."""
    (tmp_path / "file").write_text("")
    board = tmp_path / blocked
    argv = ["--tensorboard", str(board), "--run-dir", str(tmp_path / "run")]
    line = _one_line_error(capsys, argv, 1)
    reason = "it is" if blocked == "file" else f"{tmp_path / 'file'} is"
    assert line == (
        f"atomr: error: --tensorboard: cannot write {board}: {reason} not a directory; "
        "choose another --tensorboard"
    )


def test_tensorboard_without_tensorboardx_is_refused_before_any_file_is_written(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    no_training: None,
) -> None:
    """The --metrics file was created (empty) before tensorboardX was found missing."""
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    metrics = tmp_path / "m.jsonl"
    argv = ["--metrics", str(metrics), "--tensorboard", str(tmp_path / "tb")]
    line = _one_line_error(capsys, [*argv, "--run-dir", str(tmp_path / "run")], 1)
    assert line.startswith("atomr: error: --tensorboard: TensorBoard logs need tensorboardX")
    assert list(tmp_path.iterdir()) == []


def test_plots_without_matplotlib_are_refused_before_training(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    no_training: None,
) -> None:
    """`pip install -e .` without [train]: the run trained to its end, then
    failed drawing the curves."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    argv = ["--dataset", "synthetic", "--run-dir", str(tmp_path / "run")]
    line = _one_line_error(capsys, argv, 1)
    assert line == "atomr: error: plots need matplotlib: pip install -e '.[train]'"
    assert list(tmp_path.iterdir()) == []


def test_an_output_that_fails_after_training_names_what_was_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The disk fills up as the curves are drawn: the line says the history
    was written, and where (it said only that "the run's outputs" failed)."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    def full_disk(self: Figure, fname: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Figure, "savefig", full_disk)
    plot, history = tmp_path / "p.png", tmp_path / "h.json"
    argv = ["--strategy", "single", "--plot", str(plot), "--history", str(history)]
    line = _one_line_error(capsys, argv, 1)
    assert line == (
        f"atomr: error: cannot write the plot {plot}: No space left on device; "
        f"the history was written to {history} (run status: finished)"
    )
    assert history.exists() and not plot.exists()


def test_a_failed_run_whose_plot_cannot_be_written_still_says_why_it_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The plot's error took the place of the run's: the diverging loss went unsaid."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    def full_disk(self: Figure, fname: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Figure, "savefig", full_disk)
    plot, history = tmp_path / "p.png", tmp_path / "h.json"
    argv = ["--strategy", "single", "--optimizer", "sgd", "--lr", "1e10"]
    line = _one_line_error(capsys, [*argv, "--plot", str(plot), "--history", str(history)], 1)
    assert line.startswith("atomr: error: training failed: loss is not finite"), line
    assert line.endswith(
        f"; but cannot write the plot {plot}: No space left on device; "
        f"the history was written to {history} (run status: failed)"
    )


def test_a_stopped_run_whose_plot_cannot_be_written_says_its_checkpoint_was_saved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The line of an unwritten output took the place of "interrupted;
    checkpoint saved to ...": the user was not told the save stood."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    def full_disk(self: Figure, fname: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Figure, "savefig", full_disk)
    ckpt, plot = tmp_path / "c.ckpt", tmp_path / "p.png"
    argv = ["train", "--quiet", "--strategy", "single", "--checkpoint", str(ckpt)]
    argv += ["--plot", str(plot), "--history", str(tmp_path / "h.json")]
    stop = StopFlag()
    stop.request()  # a Ctrl-C as the run starts
    with pytest.raises(CliError) as caught:
        train_command.train_command(build_parser("atomr").parse_args(argv), stop)
    assert str(caught.value).endswith("(run status: interrupted); checkpoint saved to " + str(ckpt))
    assert ckpt.exists()


@pytest.mark.parametrize(
    ("flag", "value", "folder"), [("--name", "x", "atomr-runs/x"), ("--run-dir", "d", "d")]
)
def test_a_run_folder_given_twice_is_refused_unless_the_run_is_resumed(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    flag: str,
    value: str,
    folder: str,
) -> None:
    """A second `--name x` (or `--run-dir d`) overwrote the first run's
    history.json and curves.png without a word (automatic names get a
    suffix); `--resume` continues the run of that folder into it."""
    pytest.importorskip("matplotlib")
    monkeypatch.chdir(tmp_path)
    argv = ["--strategy", "single", flag, value]
    assert main(["train", "--quiet", "--epochs", "1", *argv, "--checkpoint", "c.ckpt"]) == 0
    before = {p.name: p.read_bytes() for p in (tmp_path / folder).iterdir()}
    assert sorted(before) == ["curves.png", "history.json"]
    capsys.readouterr()
    line = _one_line_error(capsys, argv, 2)
    assert line == (
        f"atomr: error: {flag} {value}: {folder} already holds the outputs of a run "
        f"(curves.png, history.json); choose another {flag}, remove {folder}, "
        "or continue that run with --resume and its checkpoint"
    )
    assert {p.name: p.read_bytes() for p in (tmp_path / folder).iterdir()} == before
    assert main(["train", "--quiet", "--epochs", "2", *argv, "--resume", "c.ckpt"]) == 0
    assert '"epoch": 2' in (tmp_path / folder / "history.json").read_text()


def test_a_resume_of_another_run_is_refused_into_a_run_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--resume y.ckpt --name x`, y.ckpt saved by run y, was accepted: run
    x's history.json was replaced by y's epochs and its curves.png redrawn,
    without a word. Only the run that saved the checkpoint (its history file
    says which) continues into a folder of outputs."""
    pytest.importorskip("matplotlib")
    monkeypatch.chdir(tmp_path)
    train = ["train", "--quiet", "--strategy", "single", "--epochs", "1"]
    assert main([*train, "--name", "x", "--checkpoint", "x.ckpt"]) == 0
    assert main([*train, "--name", "y", "--checkpoint", "y.ckpt", "--seed", "1"]) == 0
    folder = tmp_path / "atomr-runs" / "x"
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    capsys.readouterr()
    resume = ["--name", "x", "--resume", "y.ckpt", "--seed", "1", "--epochs", "2"]
    line = _one_line_error(capsys, resume, 2)
    assert line == (
        "atomr: error: --name x: atomr-runs/x holds the outputs of a run that --resume "
        "y.ckpt does not continue (curves.png, history.json); choose another --name or "
        "remove atomr-runs/x (a checkpoint continues the run its history file names)"
    )
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before  # nothing changed


def test_a_run_folder_from_before_run_ids_is_still_resumed_into(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder whose history.json names no run (written before run ids were
    kept) cannot be shown to be the checkpoint's run's; its `--resume` is
    taken on trust, as it was before run ids, so older runs go on where they
    are (and gain an id); a new run into it is still refused."""
    pytest.importorskip("matplotlib")
    monkeypatch.chdir(tmp_path)
    argv = ["--strategy", "single", "--name", "x"]
    assert main(["train", "--quiet", "--epochs", "1", *argv, "--checkpoint", "x.ckpt"]) == 0
    folder = tmp_path / "atomr-runs" / "x"
    older = json.loads((folder / "history.json").read_text())
    del older["run_id"]
    (folder / "history.json").write_text(json.dumps(older))
    assert main(["train", "--quiet", "--epochs", "1", *argv]) == 2  # a new run: refused
    resumed = ["train", "--quiet", *argv, "--resume", "x.ckpt", "--epochs", "2"]
    assert main(resumed) == 0
    after = json.loads((folder / "history.json").read_text())
    assert len(after["epochs"]) == 2 and isinstance(after["run_id"], str)
