"""`launch`: start an `atomr train` job on N processes through `mpiexec`.

`atomr launch -n N -- <train args>` is a thin wrapper over
`mpiexec -n N python -m atomr.cli train --distributed <train args>`: MPI's
own launcher starts, connects and (on failure) tears down the processes;
atomr adds nothing to its protocol. The `mpiexec` used is the one next to
the running Python (the `mpich` wheel of the `atomr[mpi]` extra installs it
there), else the first on `PATH`.

With MPICH's hydra launcher the job runs with `-disable-auto-cleanup`, so that
when one rank dies the others are not killed silently: their next collective
fails after its timeout with an error naming the dead rank, and the first
rank that reports it aborts the job (`MpiCollective.abort`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from atomr._arguments import int_at_least
from atomr.train.comm.mpi.job import MAX_PROCESSES
from atomr.train.comm.mpi.startup import (
    STARTUP_DIR_ENV,
    STARTUP_TIMEOUT_EXIT_CODE,
    failure_reports,
)
from atomr.train.comm.mpi.watchdog import LAUNCHER_PID_ENV

__all__ = [
    "INTERRUPTED_EXIT_CODE",
    "MAX_PROCESSES",
    "TIMEOUT_EXIT_CODE",
    "find_mpiexec",
    "launch",
    "mpiexec_command",
    "rank_arguments",
    "run_mpiexec",
]

# Exit code `launch` returns when the job ran past its timeout (as coreutils' `timeout`).
TIMEOUT_EXIT_CODE = 124
# Exit code `launch` returns when a second Ctrl-C ended the job (as `atomr train`).
INTERRUPTED_EXIT_CODE = 130
# Seconds the job gets to exit after SIGTERM before its whole group is SIGKILLed.
TERMINATE_GRACE_S = 10.0
# Signals on the launcher that end the whole job (the launcher then exits 128 + signum).
_ENDING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


# How often the launcher looks for start-up failures while the job runs.
_STARTUP_POLL_S = 0.5


def _poll_s(remaining: float | None) -> float:
    return _STARTUP_POLL_S if remaining is None else min(remaining, _STARTUP_POLL_S)


class _StartupFailed(Exception):
    """A rank's MPI start-up ran out of time (see `startup.py`)."""

    def __init__(self, reports: list[str]) -> None:
        super().__init__("; ".join(reports))
        self.reports = reports


class _JobEnded(Exception):
    """Raised in the launcher by a SIGTERM / SIGHUP handler."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def find_mpiexec() -> str:
    """Locate `mpiexec`: next to `sys.executable` first, then on `PATH`.

    Returns:
        The absolute path of the executable.

    Raises:
        FileNotFoundError: none found (install the extra: `pip install -e '.[mpi]'`).
    """
    for directory in (Path(sys.executable).parent, Path(sys.executable).resolve().parent):
        candidate = directory / "mpiexec"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("mpiexec")
    if found is None:
        raise FileNotFoundError(
            "mpiexec not found next to the Python interpreter nor on PATH; "
            "install the MPI extra: pip install -e '.[mpi]'"
        )
    return found


@functools.lru_cache(maxsize=8)
def _is_hydra(mpiexec: str) -> bool:
    """Whether `mpiexec` is MPICH's hydra (which takes `-disable-auto-cleanup`)."""
    try:
        out = subprocess.run(
            [mpiexec, "--version"], capture_output=True, text=True, timeout=20, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "hydra" in (out.stdout + out.stderr).lower()


def mpiexec_command(
    n: int, program: Sequence[str], *, mpiexec: str | None = None, report_failures: bool = True
) -> list[str]:
    """The `mpiexec` command line that runs `program` on `n` processes.

    Args:
        n: number of processes, >= 1.
        program: the program and its arguments (e.g. `[sys.executable, "x.py"]`).
        mpiexec: the launcher (default: `find_mpiexec()`).
        report_failures: with hydra, add `-disable-auto-cleanup` so surviving
            ranks report a dead rank themselves instead of being killed
            silently (see the module docstring).

    Returns:
        The argument list.

    Raises:
        ValueError: `n < 1` or beyond `MAX_PROCESSES`, or `program` is empty.
        FileNotFoundError: no `mpiexec` (see `find_mpiexec`).
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"the number of processes must be an int >= 1, got {n!r}")
    int_at_least("the number of processes", n, high=MAX_PROCESSES)
    if not program:
        raise ValueError("program must not be empty")
    exe = mpiexec or find_mpiexec()
    cmd = [exe]
    if report_failures and _is_hydra(exe):
        cmd.append("-disable-auto-cleanup")
    return [*cmd, "-n", str(n), *program]


def run_mpiexec(
    n: int,
    program: Sequence[str],
    timeout: float | None = None,
    *,
    env: Mapping[str, str] | None = None,
    capture: bool = False,
    report_failures: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run `program` on `n` processes under `mpiexec` and wait for the job.

    The job runs in its own process group; when it outlives `timeout` the
    whole group (launcher and ranks) is killed and the result's return code
    is `TIMEOUT_EXIT_CODE` (124). A Ctrl-C (SIGINT) on this process is
    passed on to the job (hydra forwards the first to every rank and
    force-aborts the job on the second) and the wait goes on; a job ended
    by a second Ctrl-C returns `INTERRUPTED_EXIT_CODE` (130). A SIGTERM or
    SIGHUP on this process (when it runs on the main thread) ends the whole
    job: SIGTERM to its process group, SIGKILL after `TERMINATE_GRACE_S`;
    the return code is then 128 + the signal number. The job's environment
    names this process (`LAUNCHER_PID_ENV`): if it is SIGKILLed, each rank's
    `watch_launcher` ends that rank. It also names a fresh directory
    (`STARTUP_DIR_ENV`) where ranks mark their MPI start-up: when a rank's
    start-up runs past its deadline (`startup.py`: a rank frozen before MPI's
    init blocks the others inside it), the job is ended and the return code
    is `STARTUP_TIMEOUT_EXIT_CODE`, with the ranks that never arrived named
    on stderr.

    Args:
        n: number of processes, >= 1.
        program: the program and its arguments.
        timeout: seconds before the job is killed, or None to wait forever.
        env: the environment of the job (default: this process's).
        capture: capture stdout and stderr (as text) instead of inheriting them.
        report_failures: see `mpiexec_command`.

    Returns:
        The `CompletedProcess` (stdout/stderr set when `capture`).

    Raises:
        ValueError, FileNotFoundError: see `mpiexec_command`.
    """
    cmd = mpiexec_command(n, program, report_failures=report_failures)
    pipe = subprocess.PIPE if capture else None
    with (
        tempfile.TemporaryDirectory(prefix="atomr-startup-") as startup_dir,
        subprocess.Popen(
            cmd,
            stdout=pipe,
            stderr=pipe,
            text=True,
            env={
                **(os.environ if env is None else env),
                LAUNCHER_PID_ENV: str(os.getpid()),
                STARTUP_DIR_ENV: startup_dir,
            },
            start_new_session=True,
        ) as proc,
    ):
        try:
            with _signals_end_the_job():
                out, err, interrupts = _wait_passing_on_ctrl_c(proc, timeout, Path(startup_dir))
            code = proc.returncode
            if interrupts >= 2:  # hydra's forced abort reports 0 or 1
                code = INTERRUPTED_EXIT_CODE
            elif failure_reports(Path(startup_dir)):
                code = STARTUP_TIMEOUT_EXIT_CODE  # hydra ended the job itself
        except _JobEnded as ended:
            out, err = _end_job(proc)
            code = 128 + ended.signum
        except _StartupFailed as failed:
            out, err = _end_job(proc)
            code = STARTUP_TIMEOUT_EXIT_CODE
            err = (err or "") + "\n" + "\n".join(failed.reports) + "\n"
            if not capture:
                print("\n".join(failed.reports), file=sys.stderr)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            code = TIMEOUT_EXIT_CODE
            err = (err or "") + f"\natomr: the MPI job ran past its {timeout} s timeout; killed\n"
            if not capture:
                print(err.strip(), file=sys.stderr)
    return subprocess.CompletedProcess(cmd, code, out, err)


@contextlib.contextmanager
def _signals_end_the_job() -> Iterator[None]:
    """While inside, SIGTERM and SIGHUP raise `_JobEnded` (main thread only:
    elsewhere Python cannot install handlers and the defaults stay)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def ended(signum: int, frame: object) -> None:
        raise _JobEnded(signum)

    previous = {sig: signal.signal(sig, ended) for sig in _ENDING_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _end_job(proc: subprocess.Popen[str]) -> tuple[str | None, str | None]:
    """SIGTERM the job's process group (launcher and ranks), SIGKILL it after
    `TERMINATE_GRACE_S`; returns the output collected."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        out, err = proc.communicate(timeout=TERMINATE_GRACE_S)
    except subprocess.TimeoutExpired:
        out, err = None, None
    with contextlib.suppress(ProcessLookupError):  # ranks hydra left behind, or a stuck job
        os.killpg(proc.pid, signal.SIGKILL)
    if out is None and err is None:
        out, err = proc.communicate()
    return out, err


def _wait_passing_on_ctrl_c(
    proc: subprocess.Popen[str], timeout: float | None, startup_dir: Path
) -> tuple[str | None, str | None, int]:
    """`proc.communicate(timeout)`, passing each Ctrl-C on to the job, and
    watching `startup_dir` for ranks whose MPI start-up ran out of time.

    The job runs in its own session, so the terminal's Ctrl-C reaches only
    this process: without this the ranks would go on running unseen.

    Returns:
        (stdout, stderr, number of Ctrl-C passed on).

    Raises:
        subprocess.TimeoutExpired: the job outlived `timeout`.
        _StartupFailed: a rank reported a start-up timeout.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    interrupts = 0
    while True:
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            out, err = proc.communicate(timeout=_poll_s(remaining))
        except subprocess.TimeoutExpired:
            reports = failure_reports(startup_dir)
            if reports:
                raise _StartupFailed(reports) from None
            if remaining is not None and remaining <= _STARTUP_POLL_S:
                raise
            continue
        except KeyboardInterrupt:
            interrupts += 1
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGINT)
            continue
        return out, err, interrupts


def launch(n: int, argv: list[str], timeout: float | None = None) -> int:
    """Run `atomr train --distributed <argv>` on `n` processes under `mpiexec`.

    This is what `atomr launch -n N -- <argv>` calls. Each process runs
    `python -m atomr.cli train --distributed <argv>` with this interpreter;
    `--distributed` is added unless `argv` already holds it. Output of every
    rank goes to this process's stdout/stderr.

    Args:
        n: number of processes, >= 1.
        argv: the `atomr train` arguments.
        timeout: seconds before the whole job is killed, or None.

    Returns:
        The job's exit code: 0 when every rank succeeded, the failing rank's
        (or `MPI_Abort`'s) code otherwise, `TIMEOUT_EXIT_CODE` after a timeout.
        A Ctrl-C is passed on to every rank (`atomr train` stops after the
        epoch, saving its checkpoint: 130); a second one ends the job (130).
        A SIGTERM or SIGHUP ends every rank (128 + the signal number).

    Raises:
        ValueError: `n < 1`.
        FileNotFoundError: no `mpiexec` (install the `mpi` extra: `pip install -e '.[mpi]'`).
    """
    program = [sys.executable, "-m", "atomr.cli", "train", *rank_arguments(argv)]
    return run_mpiexec(n, program, timeout).returncode


def rank_arguments(argv: Sequence[str]) -> list[str]:
    """The `atomr train` arguments each rank of `launch(n, argv)` is given:
    `argv` without a leading "--", with `--distributed` added unless it
    holds it."""
    args = list(argv)
    if "--" in args[:1]:
        args = args[1:]
    if "--distributed" not in args:
        args = ["--distributed", *args]
    return args
