"""Checking the parsed `atomr train` arguments: every check that can fail on
user input, each raising a `CliError` that says what to change, and the
defaults they resolve (devices, learning rate, model shape). `RunConfig`
(run_config.py) is built from what `checked_fields` returns.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from atomr.cli.device_option import resolve_devices
from atomr.cli.errors import CliError, count_flag
from atomr.cli.model_options import GptShape, flag_of, resolve_model
from atomr.cli.optimizer_options import checked_lr_and_momentum
from atomr.cli.strategies import STRATEGIES
from atomr.train.comm.mpi.job import DistributedTrainConfig, NotLaunchedError

__all__ = [
    "MIN_SAMPLES",
    "argument_fields",
    "checked_fields",
    "mpi_place",
    "parse_hidden",
]

_SYNTHETIC_DEFAULTS = {"samples": 20_000, "features": 64, "classes": 10}
MIN_SAMPLES = 10
"""The fewest `--samples` a synthetic set may have: a fifth is held out for testing."""


def _refuse_flags_that_do_not_apply(args: argparse.Namespace) -> None:
    """A flag that does not apply to the chosen strategy, data set or
    optimizer is an error, not silently ignored.

    Raises:
        CliError: naming the flag and what it applies to.
    """
    STRATEGIES[args.strategy].refuse_foreign_flags(
        {
            "--schedule": args.schedule,
            "--micro-batch-size": args.micro_batch_size,
            "--workers": args.workers,
            "--policy": args.policy,
            "--average-every": args.average_every,
            "--zero-stage": args.zero_stage,
        }
    )
    if args.dataset != "synthetic":
        for name in _SYNTHETIC_DEFAULTS:
            if getattr(args, name) is not None:
                raise CliError(f"--{name} only applies to --dataset synthetic")
    if args.momentum is not None and args.optimizer != "sgd":
        raise CliError("--momentum only applies to --optimizer sgd")
    _refuse_unused_run_folder(args)


def _refuse_unused_run_folder(args: argparse.Namespace) -> None:
    """`--name` names the folder under ./atomr-runs, which `--run-dir`
    replaces; both place the plot and history, which `--plot` and
    `--history` together place themselves.

    Raises:
        CliError: a folder option that would not be used.
    """
    if args.name is not None and args.run_dir is not None:
        raise CliError("--name names a folder under ./atomr-runs; with --run-dir it is unused")
    if args.plot is not None and args.history is not None:
        for flag, value in (("--name", args.name), ("--run-dir", args.run_dir)):
            if value is not None:
                raise CliError(f"{flag} is unused when --plot and --history are both given")


def parse_hidden(text: str) -> tuple[int, ...]:
    """Parse `--hidden`: comma-separated positive widths ("128" or "128,64").

    Raises:
        CliError: an empty list or width, non-integer or non-positive widths,
            or one beyond `INDEX_MAX`.
    """
    parts = [p.strip() for p in text.split(",")]
    if "" in parts:
        raise CliError(f"--hidden has an empty width: {text!r}")
    try:
        widths = tuple(int(p) for p in parts)
    except ValueError:
        raise CliError(f"--hidden must be comma-separated integers, got {text!r}") from None
    if not widths or any(w < 1 for w in widths):
        raise CliError(f"--hidden needs at least one width, each >= 1, got {text!r}")
    for width in widths:
        count_flag("--hidden width", width)
    return widths


def _is_plain_name(name: str) -> bool:
    """True for one file name that stays inside its folder: not empty, no
    separator, not "." or "..", no NUL."""
    return (
        bool(name.strip())
        and Path(name).name == name
        and name != ".."
        and not (os.altsep and os.altsep in name)
        and "\0" not in name
    )


def _path(value: str | None) -> Path | None:
    return None if value is None else Path(value).expanduser()


def _file_path(option: str, value: str | None) -> Path | None:
    """`value` as the path of a file.

    Raises:
        CliError: a path that has no file name ('', '.', '..', '/').
    """
    path = _path(value)
    if path is not None and path.name in ("", ".."):
        raise CliError(f"{option} {value!r} names a folder, not a file: give a file's path")
    return path


def _folder_path(option: str, value: str | None) -> Path | None:
    """`value` as the path of a folder ('.' for the current one).

    Raises:
        CliError: an empty path (which would write into the current folder
            unasked, as `_file_path` refuses it for a file).
    """
    if value is not None and not value.strip():
        raise CliError(f"{option} {value!r} is empty: give a folder's path ('.' for this one)")
    return _path(value)


def _check_counts(args: argparse.Namespace) -> None:
    """Check the counts (`--epochs`, `--batch-size`, `--micro-batch-size`,
    `--workers`, `--samples`, `--features`, `--average-every`, `--classes`)
    and `--seed`.

    Raises:
        CliError: a count below 1 (`--classes` below 2, `--samples` below
            `MIN_SAMPLES`) or beyond `INDEX_MAX`, a negative seed, or
            a `--micro-batch-size` larger than `--batch-size`.
    """
    for name in (
        "epochs", "batch_size", "micro_batch_size", "workers", "features", "average_every",
    ):  # fmt: skip
        count_flag(flag_of(name), getattr(args, name))
    if args.samples is not None and args.samples < MIN_SAMPLES:
        raise CliError(
            f"--samples must be >= {MIN_SAMPLES} to hold out a test set, got {args.samples}"
        )
    count_flag("--samples", args.samples)  # and at most INDEX_MAX
    count_flag("--classes", args.classes, 2)
    micro = args.micro_batch_size
    if micro is not None and micro > args.batch_size:
        raise CliError(
            f"--micro-batch-size {micro} is larger than --batch-size {args.batch_size}: each "
            "batch would be one micro-batch, with nothing to pipeline"
        )
    if args.seed < 0:
        raise CliError(f"--seed must be >= 0, got {args.seed}")


def _check_limits(args: argparse.Namespace) -> None:
    """Check `--max-steps` and `--warmup-epochs` (against `--epochs`).

    Raises:
        CliError: `--max-steps` below 1 or beyond `INDEX_MAX`, or
            `--warmup-epochs` negative or not less than `--epochs`.
    """
    count_flag("--max-steps", args.max_steps)
    if not 0 <= args.warmup_epochs < args.epochs:
        raise CliError(
            f"--warmup-epochs must be >= 0 and less than --epochs, got {args.warmup_epochs}"
        )


def _check_distributed(args: argparse.Namespace) -> None:
    """Check that `--distributed` goes with a strategy it can run.

    Raises:
        CliError: `--distributed` with a strategy that cannot run across MPI
            ranks (no `Strategy.job`).
    """
    if args.distributed and STRATEGIES[args.strategy].job is None:
        raise CliError(
            "--distributed runs data parallel (plain or sharded) across MPI ranks; it "
            f"cannot be combined with --strategy {args.strategy}"
        )


def _check_resume(args: argparse.Namespace) -> None:
    """Check that the `--resume` checkpoint exists (on this machine).

    Raises:
        CliError: a `--resume` path that is not a file.
    """
    if args.resume is not None and os.path.isdir(args.resume):
        raise CliError(f"--resume: {args.resume!r} is a directory, not a checkpoint file")
    if args.resume is not None and not os.path.isfile(args.resume):
        raise CliError(f"--resume: no such checkpoint file {args.resume!r}")


def mpi_place() -> DistributedTrainConfig:
    """This process's place in the MPI job of `--distributed`.

    Raises:
        CliError: outside an MPI launcher, or with malformed launcher variables.
    """
    try:
        return DistributedTrainConfig.from_environment(require=True)
    except NotLaunchedError:
        raise CliError(
            "--distributed runs under MPI: start it with 'atomr launch -n N -- <train "
            "args>' or 'mpiexec -n N python -m atomr.cli train --distributed ...'"
        ) from None
    except ValueError as exc:
        raise CliError(f"--distributed: {exc}") from None


def _check_name(args: argparse.Namespace) -> None:
    """Check that `--name` is one plain file name.

    Raises:
        CliError: a `--name` that is empty or leaves the runs folder.
    """
    if args.name is not None and not _is_plain_name(args.name):
        raise CliError(
            f"--name must be a plain file name inside the runs folder, got {args.name!r}"
        )


def _model_fields(args: argparse.Namespace, gpt: GptShape | None) -> dict[str, Any]:
    """The `RunConfig` fields of the model and the strategy.

    Raises:
        CliError: a bad `--hidden` (see `parse_hidden`).
    """
    return dict(
        strategy=args.strategy,
        hidden=parse_hidden(args.hidden),
        activation=args.activation,
        model=args.model,
        gpt=gpt,
    )


def _parallelism_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The `RunConfig` fields of the parallel strategies' own options."""
    return dict(
        schedule=args.schedule,
        micro_batch_size=args.micro_batch_size,
        workers=args.workers,
        distributed=args.distributed,
        policy=args.policy,
        average_every=args.average_every,
        zero_stage=args.zero_stage,
    )


def _optimisation_fields(args: argparse.Namespace, lr: float, momentum: float) -> dict[str, Any]:
    """The `RunConfig` fields of the optimizer, the loss, the run's length and
    the learning-rate schedule."""
    return dict(
        epochs=args.epochs,
        batch_size=args.batch_size,
        optimizer=args.optimizer,
        lr=float(lr),
        momentum=float(momentum),
        loss=args.loss,
        clip=args.clip,
        seed=args.seed,
        lr_schedule=args.lr_schedule,
        warmup_epochs=args.warmup_epochs,
        max_steps=args.max_steps,
    )


def _data_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The `RunConfig` fields of the data set, the synthetic sizes' defaults filled in."""
    return dict(
        dataset=args.dataset,
        **{
            k: v if getattr(args, k) is None else getattr(args, k)
            for k, v in _SYNTHETIC_DEFAULTS.items()
        },
    )


def _output_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The `RunConfig` fields of the checkpoints and outputs.

    Raises:
        CliError: a file's path that names a folder, or an empty folder path.
    """
    return dict(
        checkpoint=_file_path("--checkpoint", args.checkpoint),
        resume=_path(args.resume),
        run_dir=_folder_path("--run-dir", args.run_dir),
        name=args.name,
        plot=_file_path("--plot", args.plot),
        history=_file_path("--history", args.history),
        metrics=_file_path("--metrics", args.metrics),
        tensorboard=_folder_path("--tensorboard", args.tensorboard),
        quiet=args.quiet,
    )


def argument_fields(args: argparse.Namespace) -> dict[str, Any]:
    """Check what the parsed `atomr train` arguments decide alone and resolve
    its defaults: every check of `checked_fields` but those of this process's
    machine and files (its devices, its place in an MPI job, the `--resume`
    file). `atomr launch` runs them once, before it starts the ranks.

    Returns:
        `RunConfig`'s fields by name, but `devices` and `dist`.

    Raises:
        CliError: any option out of range or inconsistent with another.
    """
    gpt = resolve_model(args)
    _refuse_flags_that_do_not_apply(args)
    _check_counts(args)
    lr, momentum = checked_lr_and_momentum(
        args.optimizer, args.lr, args.momentum, args.loss, args.clip
    )
    _check_limits(args)
    _check_distributed(args)
    _check_name(args)
    return {
        **_model_fields(args, gpt),
        **_parallelism_fields(args),
        **_optimisation_fields(args, lr, momentum),
        **_data_fields(args),
        **_output_fields(args),
    }


def checked_fields(args: argparse.Namespace) -> dict[str, Any]:
    """Check the parsed `atomr train` arguments (`argument_fields`), then the
    `--resume` file, this process's place in an MPI job (`--distributed`) and
    its devices; resolve the defaults.

    Returns:
        `RunConfig`'s fields by name (quiet on every MPI rank but the root).

    Raises:
        CliError: any option out of range or inconsistent with another, a
            missing `--resume` file, no MPI job, or devices this machine
            does not have.
    """
    fields = argument_fields(args)
    _check_resume(args)
    dist = mpi_place() if args.distributed else None
    devices = resolve_devices(args.devices, args.strategy, dist)
    quiet = fields["quiet"] or (dist is not None and not dist.is_root)
    return {**fields, "devices": devices, "dist": dist, "quiet": quiet}
