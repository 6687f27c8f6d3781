"""`launch_command`: `atomr launch -n N -- <train args>` starts
`atomr train --distributed` as N MPI processes (`atomr.train.comm.mpi.launch.launch`),
once their arguments pass the checks that need no rank (`run_args.argument_fields`)."""

from __future__ import annotations

import importlib

from atomr.cli.app import parse_command_line
from atomr.cli.errors import CliError, check_seconds, count_flag
from atomr.cli.run_args import argument_fields
from atomr.train.comm.mpi.launch import MAX_PROCESSES, rank_arguments

__all__ = ["launch_command"]


def launch_command(nprocs: int, train_args: list[str], timeout: float | None = None) -> int:
    """Run `mpiexec -n nprocs python -m atomr.cli train --distributed <train_args>`.

    Args:
        nprocs: number of processes, >= 1.
        train_args: `atomr train` arguments (a leading "train" is dropped;
            `launch` adds `--distributed`).
        timeout: seconds before the job is killed, or None.

    Returns:
        The job's exit status.

    Raises:
        CliError: bad -n (below 1 or beyond `MAX_PROCESSES`) or --timeout;
            train arguments that every rank would refuse (`_check_ranks_arguments`),
            before any is started; or the MPI launcher is not available.
    """
    count_flag("-n", nprocs, high=MAX_PROCESSES)
    check_seconds("--timeout", timeout)
    args = list(train_args)
    if args[:1] == ["train"]:
        args = args[1:]
    args = rank_arguments(args)
    _check_ranks_arguments(args)
    try:
        launch = importlib.import_module("atomr.train.comm.mpi.launch").launch
    except (ImportError, AttributeError):
        raise CliError(
            "atomr launch is not available yet (atomr.train.comm.mpi.launch is missing)", 1
        ) from None
    try:
        return int(launch(nprocs, args, timeout=timeout))
    except (FileNotFoundError, RuntimeError, ValueError) as exc:
        raise CliError(f"atomr launch: {exc}", 1) from None


def _check_ranks_arguments(args: list[str]) -> None:
    """Parse and check the ranks' `atomr train` arguments `args` here, as each
    rank would (`parse_command_line`, then `argument_fields`: what the
    arguments decide alone), so that a refusal every rank would print
    together (a strategy that cannot run distributed, an unknown flag) is
    one line, and no rank is started. What depends on a rank's machine (its
    devices, its `--resume` file, its outputs, its data) is checked there.

    Raises:
        CliError: the line each rank would have failed with (exit status 2).
    """
    parsed, _ = parse_command_line(["train", *args])
    argument_fields(parsed)
