"""A Ctrl-C while `atomr` starts (loading the training layer, numba with it,
takes a second or more) ends in one line and exit status 130, as one during
a run does: no traceback. A SIGTERM then ends in one line and 143, leaving
no file half-written."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from atomr.cli import main
from tests.cli.test_distributed_agreement import TINY

_CTRL_C_WHILE_LOADING = textwrap.dedent(
    """
    import sys
    from importlib.abc import MetaPathFinder

    class CtrlC(MetaPathFinder):  # the Ctrl-C comes as the parser is being loaded
        def find_spec(self, name, path, target=None):
            if name == "atomr.cli.parser":
                raise KeyboardInterrupt
            return None

    sys.meta_path.insert(0, CtrlC())
    from atomr.cli import main

    sys.exit(main(["train", "--quiet"]))
    """
)


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )


def test_a_ctrl_c_while_the_command_loads_is_one_line() -> None:
    done = _run(_CTRL_C_WHILE_LOADING)
    assert (done.returncode, done.stderr) == (130, "atomr: interrupted\n")


def test_importing_the_command_loads_neither_numba_nor_the_training_layer() -> None:
    done = _run("import sys, atomr.cli; print(' '.join(sorted(sys.modules)))")
    loaded = set(done.stdout.split())
    assert "atomr.cli" in loaded
    assert not {"numba", "numpy", "atomr.train", "atomr.cli.parser"} & loaded


_SIGTERM_AT = textwrap.dedent(
    """
    import os, signal, sys
    from importlib.abc import MetaPathFinder

    def sigterm():
        os.kill(os.getpid(), signal.SIGTERM)  # handled before os.kill returns

    class WhileLoading(MetaPathFinder):  # as the parser is being loaded
        def find_spec(self, name, path, target=None):
            if name == "atomr.cli.parser" and sys.argv[1] == "loading":
                sigterm()
            return None

    sys.meta_path.insert(0, WhileLoading())
    from atomr.cli import main
    import atomr.cli.train_command as command

    def after(name):  # the signal comes once command.<name> has returned
        real = getattr(command, name)

        def then_sigterm(*args):
            result = real(*args)
            sigterm()
            return result

        setattr(command, name, then_sigterm)

    if sys.argv[1] != "loading":
        after(sys.argv[1])
    sys.exit(main(["train", *sys.argv[2:]]))
    """
)


def _sigterm_at(point: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`atomr train` with a SIGTERM at `point`: "loading" (the parser), or
    once `atomr.cli.train_command`'s function of that name has returned."""
    return subprocess.run(
        [sys.executable, "-c", _SIGTERM_AT, point, *args],
        capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path,
    )  # fmt: skip


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def test_a_sigterm_while_the_command_loads_is_one_line(tmp_path: Path) -> None:
    """It killed the process without a word (status -15), where a Ctrl-C
    says `atomr: interrupted`."""
    done = _sigterm_at("loading", tmp_path, "--quiet")
    assert (done.returncode, done.stderr) == (143, "atomr: interrupted (SIGTERM)\n")
    assert _files(tmp_path) == []


def test_a_sigterm_while_the_data_loads_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    run = tmp_path / "run"
    outputs = ["--run-dir", str(run), "--checkpoint", str(run / "c.ckpt")]
    done = _sigterm_at("load_dataset", tmp_path, *TINY, *outputs, "--metrics", str(run / "m.jsonl"))
    assert (done.returncode, done.stderr) == (143, "atomr: interrupted (SIGTERM)\n")
    assert done.stdout == ""
    assert _files(tmp_path) == []


def test_a_sigterm_once_the_metrics_log_is_open_stops_the_run_cleanly(tmp_path: Path) -> None:
    """The log was opened before the run's signal handler: a SIGTERM then
    killed the process, leaving the log and no history; it stops the run
    as one during training does."""
    run = tmp_path / "run"
    metrics = run / "m.jsonl"
    done = _sigterm_at(
        "_metrics_logs", tmp_path, *TINY, "--run-dir", str(run), "--metrics", str(metrics)
    )
    assert done.returncode == 143, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == "atomr: interrupted"
    assert json.loads((run / "history.json").read_text())["status"] == "interrupted"
    for line in metrics.read_text().splitlines():
        json.loads(line)  # whole lines only


def test_main_leaves_sigterm_as_it_found_it() -> None:
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert main(["--version"]) == 0
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
