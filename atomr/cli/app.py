"""`main`: parse the command line, dispatch to a subcommand, and turn every
user-facing error into one line and a non-zero exit status.

This module, `errors` and `interrupt` import nothing heavy: the parser (which
imports the training layer, numba with it: a second or more) is imported
inside `main`, so that a Ctrl-C or a SIGTERM meanwhile ends in one line, as
it does later."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import atomr
from atomr.cli.errors import CliError, reported_as
from atomr.cli.interrupt import interruption, sigterm_interrupts

__all__ = ["main", "parse_command_line"]

# What `atomr launch` / `atomr bench` pass on goes after "--"; a user who
# forgot it is told so.
_PASSED_ON = {
    "launch": "the arguments of atomr train go after '--': atomr launch -n N -- --epochs 5",
    "bench": "the scripts' arguments go after '--': atomr bench SUITE -- --tells 10000",
}


def _split_passthrough(argv: list[str]) -> tuple[list[str], list[str]]:
    """Split at the first "--": atomr's own arguments, then those passed on
    (to the benchmark scripts, or to `atomr train` by `atomr launch`)."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


def parse_command_line(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The parsed arguments of the `atomr` command (`argv`, without the
    program name), and those after "--". `atomr launch` parses its ranks'
    command lines with it too.

    Raises:
        CliError: arguments the command does not take.
    """
    from atomr.cli.parser import build_parser

    own, passed = _split_passthrough(argv)
    args, extra = build_parser(atomr.__version__).parse_known_args(own)
    if extra:  # named after the command, whose --help lists what it takes
        command = f"atomr {args.command}" if args.command else "atomr"
        hint = f"; {_PASSED_ON[args.command]}" if args.command in _PASSED_ON else ""
        raise CliError(f"unrecognized arguments: {' '.join(extra)} (see '{command} --help'{hint})")
    if passed and args.command not in ("bench", "launch"):
        raise CliError(f"'atomr {args.command}' takes no arguments after '--'")
    return args, passed


def _dispatch(argv: Sequence[str] | None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    try:
        args, passed = parse_command_line(words)
    except (CliError, KeyboardInterrupt) as exc:  # an interrupt: while the parser loads
        from atomr.cli.parser import asks_for_distributed_training

        if asks_for_distributed_training(_split_passthrough(words)[0]):
            from atomr.cli.job import stop_every_rank

            stop_every_rank(True, exc)  # the other ranks wait for this one's options
        raise
    if args.command == "train":
        from atomr.cli.train_command import train_command

        return train_command(args)
    if args.command == "devices":
        from atomr.cli.devices import list_devices_command

        return list_devices_command(as_json=args.json)
    if args.command == "warmup":
        from atomr.cli.warmup_command import warmup_command

        return warmup_command()
    if args.command == "bench":
        from atomr.cli.bench import run_bench

        return run_bench(args.suite, args.benchmarks_dir, passed, args.json, args.timeout)
    if args.command == "launch":
        from atomr.cli.launching import launch_command

        return launch_command(args.nprocs, passed, args.timeout)
    raise CliError(f"unknown command {args.command!r}")  # argparse prevents this


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `atomr` command.

    Args:
        argv: the arguments after the program name (default: `sys.argv[1:]`).

    Returns:
        The exit status: 0 on success, 2 for bad arguments, 1 for other
        errors, 130 when stopped by Ctrl-C, 143 by SIGTERM (at any point:
        `atomr.cli.interrupt` handles both).
    """
    with sigterm_interrupts():
        try:
            return _dispatch(argv)
        except Exception as exc:
            error = reported_as(exc)  # e.g. an unwritable --checkpoint path: an OSError
            if error is None:
                raise
            print(f"atomr: error: {error}", file=sys.stderr)
            return error.exit_code
        except KeyboardInterrupt as interrupt:  # SIGTERM's `Terminated` too
            line, status = interruption(interrupt)
            print(f"atomr: {line}", file=sys.stderr)
            return status
        except SystemExit as exc:  # --help and --version exit through argparse
            return exc.code if isinstance(exc.code, int) else 0
