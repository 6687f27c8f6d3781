"""`launch_command`: `atomr launch -n N -- <train args>` starts
`atomr train --distributed` as N MPI processes (`atomr.train.comm.mpi.launch.launch`)."""

from __future__ import annotations

import importlib

from atomr.cli.errors import CliError, check_seconds, count_flag
from atomr.train.comm.mpi.launch import MAX_PROCESSES

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
        CliError: bad -n (below 1 or beyond `MAX_PROCESSES`) or --timeout, or
            the MPI launcher is not available.
    """
    count_flag("-n", nprocs, high=MAX_PROCESSES)
    check_seconds("--timeout", timeout)
    args = list(train_args)
    if args[:1] == ["train"]:
        args = args[1:]
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
