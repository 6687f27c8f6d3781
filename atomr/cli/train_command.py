"""`train_command`: the `atomr train` command from parsed options to files.

Checks the options, loads the data and works out where the run starts
(`_prepare`: what may fail on one rank of a `--distributed` job, so that
rank then tells the others), joins the job, runs the shared epoch loop
under a Ctrl-C handler, then writes the history JSON and the curves PNG
and prints the summary table.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import atomr
from atomr.actor import AskTimeoutError
from atomr.cli.agreement import shared_options
from atomr.cli.compiling import say_when_compiling
from atomr.cli.dataset import Dataset, load_dataset
from atomr.cli.errors import CliError
from atomr.cli.history import History, history_path_for
from atomr.cli.interrupt import stop_on_signals
from atomr.cli.job import open_job, stop_every_rank
from atomr.cli.memory import check_memory
from atomr.cli.outputs import check_outputs, check_run_folder, output_paths
from atomr.cli.plotting import save_curves
from atomr.cli.progress import Progress
from atomr.cli.run_config import RunConfig
from atomr.cli.summary import summary_table
from atomr.cli.training_run import RunStart, plan_start, train_epochs
from atomr.train.core.errors import (
    CheckpointError,
    InvalidBatchError,
    NonFiniteError,
    OtherProcessFailed,
    WorkerStateLost,
)
from atomr.train.core.text import generate
from atomr.train.fit import StopFlag
from atomr.train.metrics import JsonLinesLog, TensorBoardLog

__all__ = ["EXIT_INTERRUPTED", "train_command"]

EXIT_INTERRUPTED = 130

TRAINING_FAILURES = (
    NonFiniteError,
    InvalidBatchError,
    WorkerStateLost,
    AskTimeoutError,
    OtherProcessFailed,
)
"""What a trainer raises when a run cannot go on (under `--distributed`,
on the ranks whose part did not fail: the failing rank shows its own
error): reported in one line, with
the history written (status "failed"), as is a metrics log or the history
beside the checkpoint that cannot be written (`_failed_output`); anything
else is a bug, with its traceback."""


def _metrics_options(run: RunConfig) -> list[tuple[str, Path, type[JsonLinesLog | TensorBoardLog]]]:
    """The metrics logs asked for: option, path, log class."""
    wanted: list[tuple[str, Path | None, type[JsonLinesLog | TensorBoardLog]]] = [
        ("--metrics", run.metrics, JsonLinesLog),
        ("--tensorboard", run.tensorboard, TensorBoardLog),
    ]
    return [(flag, path, log_class) for flag, path, log_class in wanted if path is not None]


def _failed_output(run: RunConfig, exc: BaseException) -> str | None:
    """`--metrics PATH` or `--tensorboard DIR` when `exc` is the `OSError` of
    that log (its `filename` names what the log writes), else None."""
    if not isinstance(exc, OSError) or exc.filename is None:
        return None
    for flag, path, _ in _metrics_options(run):
        if exc.filename == str(path):
            return f"{flag} {path}"
    return None


def _checkpoint_history_error(run: RunConfig, exc: BaseException) -> OSError | None:
    """`exc` when it is the `OSError` of the history written beside the
    checkpoint (`History.save` sets its `filename`), else None."""
    if not isinstance(exc, OSError) or run.checkpoint is None:
        return None
    return exc if exc.filename == str(history_path_for(run.checkpoint)) else None


def _metrics_logs(run: RunConfig) -> list[JsonLinesLog | TensorBoardLog]:
    """The `--metrics` and `--tensorboard` logs (the root process writes them).

    Raises:
        CliError: a log that cannot be opened, or tensorboardX missing.
    """
    if run.dist is not None and not run.dist.is_root:
        return []
    logs: list[JsonLinesLog | TensorBoardLog] = []
    for flag, path, log_class in _metrics_options(run):
        try:
            logs.append(log_class(path))
        except (OSError, ImportError) as exc:
            for log in logs:
                log.close()
            raise CliError(f"{flag}: {exc}", 1) from None
    return logs


SAMPLE_PROMPT = "The "
SAMPLE_LENGTH = 240


def _sample(run: RunConfig, data: Dataset, weights: np.ndarray) -> str:
    """A sample of the trained GPT's text, after `SAMPLE_PROMPT`."""
    assert run.gpt is not None and data.vocab is not None
    model = run.gpt.build(data.classes, run.seed)
    model.set_params(weights)
    text = generate(model, data.vocab, SAMPLE_PROMPT, SAMPLE_LENGTH, seed=run.seed)
    return f"sample (temperature 0.8):\n{SAMPLE_PROMPT}{text}"


@dataclass(frozen=True)
class _Prepared:
    """A run made ready before any rank is joined: its options, outputs,
    data, history so far and start."""

    run: RunConfig
    plot_path: Path
    history_path: Path
    data: Dataset
    history: History
    start: RunStart


def _prepare(args: argparse.Namespace) -> _Prepared:
    """Check the options and the outputs (which the root writes), check the
    memory, load the data set and work out where the run starts.

    Raises:
        CliError: as `RunConfig.from_args`, `check_outputs`, `check_memory`,
            `load_dataset`, `plan_start` and `check_run_folder`.
    """
    run = RunConfig.from_args(args)
    plot_path, history_path = output_paths(run)
    writes = run.dist is None or run.dist.is_root
    if writes:
        check_outputs(run, plot_path, history_path)
    check_memory(run)
    data = load_dataset(run)
    history = History(config=run.to_json())
    start = plan_start(run, data, history)
    if writes:  # once the run it continues, if any, is known
        check_run_folder(run, plot_path, history_path, history)
    return _Prepared(run, plot_path, history_path, data, history, start)


def train_command(args: argparse.Namespace, stop: StopFlag | None = None) -> int:
    """Train as `args` say, write the outputs and print the summary.

    Args:
        args: the parsed `atomr train` arguments.
        stop: a flag a caller can set to stop the run (Ctrl-C sets it too).

    Returns:
        The exit status: 0 when finished, 130 when stopped by Ctrl-C (or a
        `stop` flag), 143 by SIGTERM (a signal once training is over lets
        the outputs be written and leaves the run's status).

    Raises:
        CliError: bad options, unusable checkpoints, missing optional
            packages; under `--distributed`, on every rank alike, any of
            these on one rank (naming it) or ranks given different options;
            exit status 1 when the trainer stopped the run
            (`TRAINING_FAILURES`: a diverging loss, say) or a metrics log
            or the history beside the checkpoint could not be written (a
            full disk).
    """
    try:
        prepared = _prepare(args)
        mine = shared_options(prepared.run, prepared.start)
    except (Exception, KeyboardInterrupt) as exc:  # a Ctrl-C or SIGTERM too
        stop_every_rank(args.distributed, exc)  # the other ranks wait for this one
        raise
    return _run_and_report(prepared, mine, StopFlag() if stop is None else stop)


def _run_and_report(prepared: _Prepared, mine: dict[str, Any], flag: StopFlag) -> int:
    """Join the job (`open_job`, with this rank's `shared_options`, `mine`),
    train the prepared run in it; write its outputs and print its summary
    where this process writes files. A signal is handled from the joining
    of the job to the last output written (`stop_on_signals`): one that
    comes once training is over lets the outputs be written; one while the
    ranks join stops the run before its first step, on every rank (where it
    ended that rank alone, and the others waited for it until their
    deadline); before, SIGTERM ends the command as Ctrl-C does
    (`atomr.cli.interrupt.sigterm_interrupts`). Returns and raises as
    `train_command`."""
    run, data, history = prepared.run, prepared.data, prepared.history

    def progress(total: int, done: int) -> Progress:
        return Progress(total, done, enabled=not run.quiet)

    logs: list[JsonLinesLog | TensorBoardLog] = []
    failed: Exception | None = None
    trained: list[np.ndarray] = []
    signals: list[int] = []

    async def go() -> History:
        await job.none_failed(failed)  # rank 0 alone opens logs: all stop if it could not
        with say_when_compiling(enabled=not run.quiet):
            return await train_epochs(
                run,
                data,
                history,
                flag,
                progress_factory=progress,
                callbacks=logs,
                on_weights=trained.append if data.vocab is not None else None,
                job=job,
                start=prepared.start,
            )

    # from the joining of the job: a signal stops the run, no log is left unclosed
    with stop_on_signals(flag, signals, over=lambda: history.status != "running"):
        job = atomr.run(open_job(run.dist, mine))  # every rank stops here, or none
        try:
            logs = _metrics_logs(run)
        except Exception as exc:  # every rank hears of it, in go()
            failed = exc
        try:
            with _closing(logs):
                atomr.run(go())
        except Exception as exc:
            try:
                _fail_in_one_line(run, exc, history, prepared.plot_path, prepared.history_path)
            finally:
                job.failed()  # outputs written, the error printed next: tell the other ranks
            raise
        if run.dist is None or run.dist.is_root:
            _report(prepared, trained)
    if history.status != "interrupted":
        return 0
    return 128 + signals[0] if signals else EXIT_INTERRUPTED


def _report(prepared: _Prepared, trained: list[np.ndarray]) -> None:
    """Write the outputs of a run that ended, print its summary (and the
    GPT's sample from its `trained` weights), and say when it was stopped.

    Raises:
        CliError: as `_write_outputs`, saying where the checkpoint was saved.
    """
    run, history = prepared.run, prepared.history
    try:
        _write_outputs(history, prepared.plot_path, prepared.history_path)
    except CliError as exc:
        if run.checkpoint is None:
            raise
        raise CliError(f"{exc}; checkpoint saved to {run.checkpoint}", exc.exit_code) from None
    _print_summary(run, history, prepared.plot_path, prepared.history_path)
    if trained and prepared.data.vocab is not None and not run.quiet:  # --quiet: one line
        print(_sample(run, prepared.data, trained[-1]))
    if history.status == "interrupted":
        where = f"; checkpoint saved to {run.checkpoint}" if run.checkpoint else ""
        print(f"atomr: interrupted{where}", file=sys.stderr)


def _closing(logs: list[JsonLinesLog | TensorBoardLog]) -> contextlib.ExitStack:
    """The logs, closed at the block's end: one that cannot be closed fails
    a run that succeeded (an error in flight stays the one raised)."""
    stack = contextlib.ExitStack()
    for log in logs:
        stack.enter_context(log)
    return stack


def _fail_in_one_line(
    run: RunConfig, exc: Exception, history: History, plot_path: Path, history_path: Path
) -> None:
    """For a training failure (`_failure_line`): write the outputs of a
    failed run and raise its one line; return for any other error.

    Raises:
        CliError: `exc` is a training failure (exit status 1), followed by
            what `_write_outputs` could not write.
    """
    line = _failure_line(run, exc, history_path)
    if line is None:
        return
    history.status = "failed"
    if run.dist is None or run.dist.is_root:
        try:
            _write_outputs(history, plot_path, history_path)
        except CliError as unwritten:  # the run's own failure stays the news
            line = f"{line}; but {unwritten}"
    raise CliError(line, exit_code=1) from exc


def _failure_line(run: RunConfig, exc: BaseException, history_path: Path) -> str | None:
    """One line for a run the trainer stopped or whose metrics log or
    checkpoint history could not be written: what failed, what was kept,
    and the usual cure for a diverging run; None for any other error."""
    kept = f"; checkpoint at the last good step in {run.checkpoint}" if run.checkpoint else ""
    unwritten = _checkpoint_history_error(run, exc)
    if unwritten is not None:
        return (
            f"training failed: cannot write the checkpoint's history {unwritten.filename}: "
            f"{unwritten.strerror or unwritten}; the checkpoint in {run.checkpoint} was saved, "
            "its history not "
            "(--resume takes the position from the checkpoint's step, without the earlier "
            f"epochs); history in {history_path}"
        )
    output = _failed_output(run, exc)
    if output is not None:
        reason = getattr(exc, "strerror", None) or exc
        return f"training failed: cannot write {output}: {reason}{kept}; history in {history_path}"
    if not isinstance(exc, TRAINING_FAILURES):
        return None
    hint = "; lower --lr or add --clip" if isinstance(exc, NonFiniteError) else ""
    return f"training failed: {exc}{hint}{kept}; history in {history_path}"


def _write_outputs(history: History, plot_path: Path, history_path: Path) -> None:
    """Save the run's history (JSON) and its curves (plot), each whatever
    became of the other.

    Raises:
        CliError: naming each file that could not be written and why, and
            the one that was (exit status 1); as `save_curves` without
            matplotlib.
    """
    outputs = (
        ("history", history_path, lambda: history.save(history_path)),
        ("plot", plot_path, lambda: save_curves(history, plot_path)),
    )
    unwritten, written = [], []
    for what, path, write in outputs:
        try:
            write()
        except (OSError, CheckpointError) as exc:
            reason = getattr(exc, "strerror", None) or exc
            unwritten.append(f"the {what} {path}: {reason}")
        else:
            written.append(f"; the {what} was written to {path}")
    if unwritten:
        status = f" (run status: {history.status})"
        raise CliError(f"cannot write {' nor '.join(unwritten)}{''.join(written)}{status}", 1)


def _print_summary(run: RunConfig, history: History, plot_path: Path, history_path: Path) -> None:
    """Print the run's summary: a table, or one line with ``--quiet``."""
    outputs = {"plot": str(plot_path), "history": str(history_path)}
    if run.checkpoint is not None:
        outputs["checkpoint"] = str(run.checkpoint)
    last = history.last
    if run.quiet:
        acc = f"{last.test_accuracy:.4f}" if last else "n/a"
        print(f"{history.status}: test accuracy {acc}; wrote {plot_path} and {history_path}")
    else:
        print(summary_table(history, outputs))
