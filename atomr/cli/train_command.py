"""`run_train`: the `atomr train` command from validated options to files.

Loads the data, runs the shared epoch loop under a Ctrl-C handler, then
writes the history JSON and the curves PNG and prints the summary table.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import atomr
from atomr.cli.dataset import load_dataset
from atomr.cli.errors import CliError
from atomr.cli.history import History
from atomr.cli.interrupt import stop_on_sigint
from atomr.cli.plotting import save_curves
from atomr.cli.progress import Progress
from atomr.cli.run_config import RunConfig
from atomr.cli.summary import summary_table
from atomr.cli.training_run import train_epochs
from atomr.train.fit import StopFlag

__all__ = ["EXIT_INTERRUPTED", "check_writable", "output_paths", "run_train"]

EXIT_INTERRUPTED = 130


def output_paths(run: RunConfig) -> tuple[Path, Path]:
    """The PNG and JSON paths of a run.

    `--plot` and `--history` win; otherwise both go into `--run-dir`, or
    `./atomr-runs/<--name or timestamp-strategy>/` (a suffix keeps two runs
    started in the same second apart).

    Returns:
        `(plot_path, history_path)`.
    """
    if run.plot is not None and run.history is not None:
        return run.plot, run.history
    run_dir = run.run_dir
    if run_dir is None:
        base = Path("atomr-runs")
        name = run.name or f"{time.strftime('%Y%m%d-%H%M%S')}-{run.strategy}"
        run_dir = base / name
        if run.name is None:
            suffix = 1
            while run_dir.exists():
                suffix += 1
                run_dir = base / f"{name}-{suffix}"
    plot = run.plot if run.plot is not None else run_dir / "curves.png"
    history = run.history if run.history is not None else run_dir / "history.json"
    return plot, history


def _unwritable(path: Path) -> str | None:
    """Why a file cannot be written at `path`, or None when it looks writable."""
    if path.is_dir():
        return "it is a directory"
    if path.exists():
        return None if os.access(path, os.W_OK) else "it is not writable"
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        return f"{parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{parent} is not writable"
    return None


def check_writable(run: RunConfig, plot: Path, history: Path) -> None:
    """Refuse output paths that cannot be written, before any training.

    Raises:
        CliError: naming the option to change (exit status 1).
    """
    targets = [
        (plot, "--plot" if run.plot is not None else "--run-dir"),
        (history, "--history" if run.history is not None else "--run-dir"),
    ]
    if run.checkpoint is not None:
        targets.append((run.checkpoint, "--checkpoint"))
    for path, flag in targets:
        reason = _unwritable(path)
        if reason is not None:
            raise CliError(f"{flag}: cannot write {path}: {reason}; choose another {flag}", 1)


def run_train(run: RunConfig, stop: StopFlag | None = None) -> int:
    """Train as `run` says, write the outputs and print the summary.

    Args:
        run: the validated options.
        stop: a flag a caller can set to stop the run (Ctrl-C sets it too).

    Returns:
        The exit status: 0 when finished, 130 when stopped by Ctrl-C.

    Raises:
        CliError: bad options the trainers refuse, unusable checkpoints,
            missing optional packages.
    """
    plot_path, history_path = output_paths(run)
    if run.dist is None:  # the ranks of a job would wait for one that stopped here
        check_writable(run, plot_path, history_path)
    data = load_dataset(run)
    flag = stop if stop is not None else StopFlag()
    history = History(config=run.to_json())

    def progress(total: int, done: int) -> Progress:
        return Progress(total, done, enabled=not run.quiet)

    async def go() -> History:
        with stop_on_sigint(flag):
            return await train_epochs(run, data, history, flag, progress_factory=progress)

    atomr.run(go())
    if run.dist is not None and not run.dist.is_root:
        return EXIT_INTERRUPTED if history.status == "interrupted" else 0
    try:
        history.save(history_path)
        save_curves(history, plot_path)
    except OSError as exc:
        raise CliError(f"cannot write the run's outputs: {exc}", 1) from None
    outputs = {"plot": str(plot_path), "history": str(history_path)}
    if run.checkpoint is not None:
        outputs["checkpoint"] = str(run.checkpoint)
    last = history.last
    if run.quiet:
        acc = f"{last.test_accuracy:.4f}" if last else "n/a"
        print(f"{history.status}: test accuracy {acc}; wrote {plot_path} and {history_path}")
    else:
        print(summary_table(history, outputs))
    if history.status == "interrupted":
        where = f"; checkpoint saved to {run.checkpoint}" if run.checkpoint else ""
        print(f"atomr: interrupted{where}", file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0
