"""Stopping a run (Ctrl-C) saves the checkpoint that was asked for, and
`--resume` continues at the very batch where it stopped."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import atomr
from atomr.cli import main
from atomr.cli.dataset import load_dataset
from atomr.cli.history import History
from atomr.cli.parser import build_parser
from atomr.cli.run_config import RunConfig
from atomr.cli.training_run import train_epochs
from atomr.train import StepStats, load_checkpoint
from atomr.train.fit import FitCallback, FitPosition, StopFlag


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


def _stop_at(stop: StopFlag, epoch: int, batch: int) -> Callable[[FitPosition], None]:
    def check(position: FitPosition) -> None:
        if (position.epoch, position.batch) == (epoch, batch):
            stop.request()

    return check


def test_stop_saves_a_checkpoint_and_resume_continues_at_that_batch(tmp_path: Path) -> None:
    ckpt = tmp_path / "stop.ckpt"
    run = _run_config("--strategy", "single", "--epochs", "2", "--checkpoint", str(ckpt))
    data = load_dataset(run)
    stop = StopFlag()

    history = History(config=run.to_json())
    atomr.run(train_epochs(run, data, history, stop, callbacks=[_OnStep(_stop_at(stop, 1, 5))]))
    assert history.status == "interrupted"
    assert [r.epoch for r in history.epochs] == [1]
    steps_per_epoch = history.epochs[0].step
    assert history.position is not None
    assert (history.position["epoch"], history.position["batch"]) == (1, 5)
    assert load_checkpoint(ckpt).step == steps_per_epoch + 5

    # resume: the first step taken is batch 5 of epoch 2, and the run finishes
    resumed = _run_config("--strategy", "single", "--epochs", "2", "--resume", str(ckpt))
    seen: list[tuple[int, int, int]] = []
    again = History(config=resumed.to_json())

    def record(position: FitPosition) -> None:
        seen.append((position.epoch, position.batch, position.step))

    atomr.run(train_epochs(resumed, data, again, StopFlag(), callbacks=[_OnStep(record)]))
    assert again.status == "finished"
    assert seen[0] == (1, 6, steps_per_epoch + 6)
    assert len(seen) == steps_per_epoch - 5
    assert [r.step for r in again.epochs] == [steps_per_epoch, 2 * steps_per_epoch]


def test_stopped_and_resumed_equals_uninterrupted(tmp_path: Path) -> None:
    """Same seed, same batches: stopping and resuming changes nothing."""
    ckpt = tmp_path / "s.ckpt"
    straight = _run_config(
        "--strategy", "single", "--epochs", "2", "--checkpoint", str(tmp_path / "straight.ckpt")
    )
    data = load_dataset(straight)
    atomr.run(train_epochs(straight, data, History(config={}), StopFlag()))

    stop = StopFlag()
    first = _run_config("--strategy", "single", "--epochs", "2", "--checkpoint", str(ckpt))
    atomr.run(
        train_epochs(
            first,
            data,
            History(config={}),
            stop,
            callbacks=[_OnStep(lambda p: stop.request() if p.step == 17 else None)],
        )
    )
    second = _run_config(
        "--strategy", "single", "--epochs", "2", "--resume", str(ckpt), "--checkpoint", str(ckpt)
    )
    atomr.run(train_epochs(second, data, History(config={}), StopFlag()))
    a, b = load_checkpoint(tmp_path / "straight.ckpt"), load_checkpoint(ckpt)
    assert a.step == b.step
    np.testing.assert_allclose(a.weights, b.weights, rtol=0, atol=1e-6)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_stops_cleanly_after_saving(tmp_path: Path, signum: int) -> None:
    """SIGTERM (kill, docker stop, a scheduler) stops as Ctrl-C does; it
    killed the run, losing the batches since the last epoch's checkpoint."""
    ckpt = tmp_path / "ctrl-c.ckpt"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "atomr.cli",
            "train",
            "--strategy",
            "single",
            "--dataset",
            "synthetic",
            "--epochs",
            "100000",
            "--checkpoint",
            str(ckpt),
            "--run-dir",
            str(tmp_path / "run"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
    )
    try:
        # wait until training is under way (the progress bar shows steps)
        assert proc.stderr is not None
        seen = b""
        while b"samples_s=" not in seen:
            chunk = proc.stderr.read1(4096)
            assert chunk, "the run ended before it started training"
            seen += chunk
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == 128 + signum, err.decode()
    assert b"Traceback" not in err
    hint = "press Ctrl-C again" if signum == signal.SIGINT else "a second SIGTERM or Ctrl-C"
    assert hint in err.decode()  # a SIGTERM's hint spoke of a Ctrl-C
    assert err.decode().strip().splitlines()[-1] == (
        f"atomr: interrupted; checkpoint saved to {ckpt}"
    )
    assert re.search(rb"^status +interrupted$", out, re.MULTILINE)
    assert load_checkpoint(ckpt).step > 0
    history = json.loads((tmp_path / "run" / "history.json").read_text())
    assert history["status"] == "interrupted"
    side = json.loads(ckpt.with_name(ckpt.name + ".history.json").read_text())
    assert side["position"]["step"] == load_checkpoint(ckpt).step
    # and it resumes from there
    code = main(
        [
            "train",
            "--strategy",
            "single",
            "--dataset",
            "synthetic",
            "--quiet",
            "--epochs",
            str(side["position"]["epoch"] + 1),
            "--resume",
            str(ckpt),
            "--run-dir",
            str(tmp_path / "resumed"),
        ]
    )
    assert code == 0


_SIGNAL_WHILE_PLOTTING = textwrap.dedent(
    """
    import os, sys
    from importlib.abc import MetaPathFinder

    class Signal(MetaPathFinder):  # the signal comes as the curves are drawn
        def find_spec(self, name, path, target=None):
            if name == "matplotlib.figure":
                sys.meta_path.remove(self)
                os.kill(os.getpid(), int(sys.argv[1]))
            return None

    sys.meta_path.insert(0, Signal())
    from atomr.cli import main

    sys.exit(main(["train", "--quiet", *sys.argv[2:]]))
    """
)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_after_training_finished_still_writes_the_outputs(
    tmp_path: Path, signum: int
) -> None:
    """Training is over when the signal comes (the curves are being drawn):
    its results are written, not lost (a Ctrl-C left no plot and said
    nothing of it; a SIGTERM killed the process before the plot)."""
    args = ["--strategy", "single", "--epochs", "1", "--run-dir", str(tmp_path / "run")]
    done = subprocess.run(
        [sys.executable, "-c", _SIGNAL_WHILE_PLOTTING, str(int(signum)), *args],
        capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "training is over: writing its outputs first" in done.stderr
    assert "Traceback" not in done.stderr
    assert (tmp_path / "run" / "curves.png").stat().st_size > 0
    history = json.loads((tmp_path / "run" / "history.json").read_text())
    assert history["status"] == "finished"
    assert done.stdout.startswith("finished: test accuracy")
