"""The files an `atomr train` run writes, and the checks made on them
before any training: they must be distinct, of the right kind, not
in a run folder (`--run-dir`, `--name`'s) of an earlier run's outputs (but
for a `--resume` that continues that run), and
writable (probed with a real write, so EPERM or EIO show up now, not after
the whole run); `--tensorboard` also needs tensorboardX."""

from __future__ import annotations

import time
from pathlib import Path

from atomr.cli.errors import CliError
from atomr.cli.history import History, history_path_for
from atomr.cli.plotting import check_matplotlib
from atomr.cli.run_config import RunConfig
from atomr.train.core.checkpoint import probe_write
from atomr.train.metrics import summary_writer_class

__all__ = ["RUNS_DIR", "check_outputs", "check_run_folder", "output_paths"]

RUNS_DIR = Path("atomr-runs")


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
        name = run.name or f"{time.strftime('%Y%m%d-%H%M%S')}-{run.strategy}"
        run_dir = RUNS_DIR / name
        if run.name is None:
            suffix = 1
            while run_dir.exists():
                suffix += 1
                run_dir = RUNS_DIR / f"{name}-{suffix}"
    plot = run.plot if run.plot is not None else run_dir / "curves.png"
    history = run.history if run.history is not None else run_dir / "history.json"
    return plot, history


def _probe(path: Path) -> str | None:
    """Why a file cannot be written at `path`, or None when a real write
    worked: an existing file is opened for appending (nothing written); a new
    one is tried as a one-byte temp file, synced and removed, in the nearest
    existing folder."""
    if path.is_dir():
        return "it is a directory"
    if path.exists():
        if not path.is_file():
            return "it is not a regular file"
        try:
            with open(path, "ab"):
                return None
        except OSError as exc:
            return exc.strerror or str(exc)
    return _probe_nearest_folder(path.parent)


def _probe_folder(path: Path) -> str | None:
    """Why files cannot be written in a folder at `path` (made when missing),
    or None when a real write worked in it, or in its nearest existing
    parent."""
    if path.exists() and not path.is_dir():
        return "it is not a directory"
    return _probe_nearest_folder(path)


def _probe_nearest_folder(parent: Path) -> str | None:
    """Why a one-byte temp file cannot be written, synced and removed in
    `parent` or, where it is missing, its nearest existing parent."""
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        return f"{parent} is not a directory"
    try:
        probe_write(parent)
    except OSError as exc:
        return f"{parent}: {exc.strerror or exc}"
    return None


def _named_outputs(run: RunConfig, plot: Path, history: Path) -> list[tuple[str, Path]]:
    """(option, path) of every file the run writes."""
    targets = [
        ("--plot" if run.plot is not None else "--run-dir", plot),
        ("--history" if run.history is not None else "--run-dir", history),
    ]
    if run.checkpoint is not None:
        targets.append(("--checkpoint", run.checkpoint))
        targets.append(("--checkpoint (its history file)", history_path_for(run.checkpoint)))
    if run.metrics is not None:
        targets.append(("--metrics", run.metrics))
    return targets


def _check_distinct(run: RunConfig, targets: list[tuple[str, Path]]) -> None:
    """Two outputs, or an output and the `--resume` checkpoint (other than
    `--checkpoint`, which may continue it), must not be the same file, nor
    one inside the other (`--checkpoint runs/a` with `--run-dir runs/a`)."""
    seen: dict[Path, str] = {}
    if run.resume is not None:
        seen[run.resume.resolve()] = "--resume"
    for flag, path in targets:
        key = path.resolve()
        other = seen.get(key)
        if other is not None and not (flag == "--checkpoint" and other == "--resume"):
            raise CliError(f"{flag} {path} is the same file as {other}; give each output its own")
        seen[key] = flag
    files = {  # a folder (--tensorboard's, or one given for a file) is refused by _probe
        key: flag for key, flag in seen.items() if flag != "--tensorboard" and not key.is_dir()
    }
    for flag, path in targets:
        inside = next((files[p] for p in path.resolve().parents if p in files), None)
        if inside is not None:
            raise CliError(
                f"{flag} {path} would be inside the file of {inside}; give each output its own"
            )


def _run_folder(run: RunConfig, plot: Path, history: Path) -> tuple[str, list[Path]]:
    """The option that names the run's folder (`--run-dir DIR` or `--name
    NAME`; "" for a folder named by time, new) and the outputs it puts
    there (not those `--plot` or `--history` name)."""
    flag = (
        f"--run-dir {run.run_dir}"
        if run.run_dir is not None
        else ("" if run.name is None else f"--name {run.name}")
    )
    given = ((plot, run.plot), (history, run.history))
    return flag, [path for path, named in given if named is None]


def check_run_folder(run: RunConfig, plot: Path, history_path: Path, history: History) -> None:
    """Refuse a run folder (`--run-dir`, or `--name`'s) that holds the
    outputs of an earlier run, which this run's would replace, unless this
    run continues that one: `history`'s run id (the `--resume`
    checkpoint's run's, `resume_position`) is the one in the folder's
    history.json. A `--resume` into a folder whose history.json was written
    before run ids were kept (it names none) is taken on trust, as it was
    then. Call it once `history` is planned, before any training.

    Raises:
        CliError: (exit 2) naming the option, the folder, the files and the
            ways out.
    """
    flag, outputs = _run_folder(run, plot, history_path)
    kept = sorted(p.name for p in outputs if p.exists())
    if not flag or not kept:
        return
    folder = outputs[0].parent
    try:
        earlier: History | None = History.load(folder / "history.json")
    except (OSError, ValueError):
        earlier = None  # no history (or not one): which run it was is unknown
    if earlier is not None and earlier.run_id == history.run_id:
        return  # this run continues it
    if earlier is not None and earlier.run_id is None and run.resume is not None:
        return  # a folder from before run ids: its --resume is taken on trust, as then
    option = flag.split(" ")[0]
    if run.resume is None:
        raise CliError(
            f"{flag}: {folder} already holds the outputs of a run ({', '.join(kept)}); "
            f"choose another {option}, remove {folder}, "
            "or continue that run with --resume and its checkpoint"
        )
    unknown = "is not known to continue" if earlier is None else "does not continue"
    raise CliError(
        f"{flag}: {folder} holds the outputs of a run that --resume {run.resume} {unknown} "
        f"({', '.join(kept)}); choose another {option} or remove {folder} "
        "(a checkpoint continues the run its history file names)"
    )


def check_outputs(run: RunConfig, plot: Path, history: Path) -> None:
    """Refuse outputs that would clash or fail, before any training (and
    before any is written: the logs are opened only once every rank of a
    `--distributed` job agreed).

    Raises:
        CliError: naming the option to change: `--plot` not ending in .png
            (exit 2), two outputs on one file (exit 2), a path that cannot be
            written, `--tensorboard` without tensorboardX, or no matplotlib
            to draw the curves with (exit 1).
    """
    if run.plot is not None and run.plot.suffix.lower() != ".png":
        raise CliError(f"--plot writes a PNG: give a path ending in .png, got {run.plot}")
    targets = _named_outputs(run, plot, history)
    folders = [("--tensorboard", run.tensorboard)] if run.tensorboard is not None else []
    _check_distinct(run, targets + folders)
    probes = [(flag, path, _probe) for flag, path in targets]
    probes += [(flag, path, _probe_folder) for flag, path in folders]
    for flag, path, probe in probes:
        reason = probe(path)
        if reason is not None:
            flag = flag.split(" ")[0]
            raise CliError(f"{flag}: cannot write {path}: {reason}; choose another {flag}", 1)
    if folders:
        try:
            summary_writer_class()
        except ImportError as exc:
            raise CliError(f"--tensorboard: {exc}", 1) from None
    check_matplotlib()  # the curves are drawn after training: not then
