"""`StartupDeadline`: MPI start-up (init and the first collective calls) has a deadline.

MPI's init and the communicator duplication that follows it are collective:
a rank that never gets there (frozen, or stuck before it) leaves every other
rank blocked inside MPI, where no timeout of ours runs. So each rank arms a
deadline on a daemon thread *before* MPI starts; if start-up has not finished
in time, the thread writes which ranks never arrived to stderr and exits the
process (`os._exit`, code `STARTUP_TIMEOUT_EXIT_CODE`).

To name the missing ranks without MPI, `run_mpiexec` gives the job a fresh
directory (`STARTUP_DIR_ENV`); each rank leaves a marker there when it reaches
start-up, and a rank whose deadline passed leaves its message there: the
launcher, which polls the directory, then ends the whole job (hydra runs with
`-disable-auto-cleanup` and would leave a frozen rank running). Ranks and the
world size come from the launcher's variables
(`DistributedTrainConfig.from_environment`). A job started by hand with
`mpiexec` has no such directory: each rank's deadline still ends that rank,
without naming the others.

`import_mpi` imports mpi4py (which initialises MPI), with an error naming
the `atomr[mpi]` extra when it is missing; `open_communicators` starts MPI
and duplicates the communicator under that deadline.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from atomr.train.comm.mpi._order import agree_on_check
from atomr.train.comm.mpi.job import DistributedTrainConfig

__all__ = [
    "STARTUP_DIR_ENV",
    "STARTUP_TIMEOUT_EXIT_CODE",
    "StartupDeadline",
    "failure_reports",
    "import_mpi",
    "missing_ranks",
    "open_communicators",
]

# The variable naming the directory where ranks mark their arrival.
STARTUP_DIR_ENV = "ATOMR_STARTUP_DIR"
# Exit code of a rank whose MPI start-up ran past its deadline.
STARTUP_TIMEOUT_EXIT_CODE = 3


def _marker(directory: Path, rank: int) -> Path:
    return directory / f"rank-{rank}.arrived"


def missing_ranks(directory: Path, world_size: int) -> list[int]:
    """The ranks of a world of `world_size` with no arrival marker in `directory`."""
    return [r for r in range(world_size) if not _marker(directory, r).exists()]


def failure_reports(directory: Path) -> list[str]:
    """What the ranks whose start-up ran out of time wrote in `directory`
    (the launcher ends the job when there is any)."""
    reports = []
    for path in sorted(directory.glob("rank-*.failed")):
        with contextlib.suppress(OSError):
            reports.append(path.read_text().strip())
    return reports


# The watchdog process: waits on its stdin for the rank to say start-up is done
# (or to die, closing the pipe); past the deadline it reports and SIGKILLs the
# rank. Self-contained, so that it starts without importing atomr.
_WATCHDOG = """
import os, select, signal, sys
parent, timeout, report, failed = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4]
ready, _, _ = select.select([sys.stdin], [], [], timeout)
if not ready:
    message = report
    directory, size, rank = os.path.dirname(failed), int(sys.argv[5]), sys.argv[6]
    if directory:
        missing = [r for r in range(size)
                   if not os.path.exists(os.path.join(directory, f"rank-{r}.arrived"))]
        if missing:
            word = "rank" if len(missing) == 1 else "ranks"
            names = ", ".join(map(str, missing))
            message += f"; {word} {names} never reached it (not started, frozen or dead)"
        else:
            message += "; every rank reached start-up, then one stopped inside MPI"
        with open(failed, "w") as out:
            out.write(message)
    else:
        message += "; cannot tell which rank is missing (not started by `atomr launch`)"
    os.write(2, (message + chr(10)).encode())
    os.kill(parent, signal.SIGKILL)
"""


class StartupDeadline:
    """A deadline on this rank's MPI start-up, armed when made.

    MPI's init holds the GIL while it waits, so no thread of this process can
    act on a deadline: a small watchdog process does. Past `timeout` it writes
    which ranks never reached start-up to stderr (and to the launcher's
    directory) and SIGKILLs this rank.

    Args:
        timeout: seconds start-up may take, or None (no deadline; the marker
            is still left).
        environ: where to read the launcher's variables and `STARTUP_DIR_ENV`
            (default: `os.environ`).

    Call `done()` once start-up has finished (every rank got through the
    first collective call). A rank that is not under an MPI launcher, or
    alone in its world, arms nothing.
    """

    def __init__(self, timeout: float | None, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        config = DistributedTrainConfig.from_environment(env)
        self.rank, self.world_size = config.rank, config.world_size
        self.timeout = timeout
        raw = env.get(STARTUP_DIR_ENV, "")
        directory = Path(raw) if raw and Path(raw).is_dir() else None
        if directory is not None:
            with contextlib.suppress(OSError):  # naming is best effort; the deadline is not
                _marker(directory, self.rank).touch()
        self._watchdog: subprocess.Popen[bytes] | None = None
        if timeout is not None and config.backend == "mpi" and self.world_size > 1:
            failed = "" if directory is None else str(directory / f"rank-{self.rank}.failed")
            head = f"atomr: rank {self.rank}: MPI start-up did not finish within {timeout:g} s"
            self._watchdog = subprocess.Popen(
                [sys.executable, "-S", "-c", _WATCHDOG, str(os.getpid()), str(timeout),
                 head, failed, str(self.world_size), str(self.rank)],
                stdin=subprocess.PIPE,
            )  # fmt: skip

    def done(self) -> None:
        """Start-up finished: disarm the deadline (the watchdog exits)."""
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None and watchdog.stdin is not None:
            watchdog.stdin.close()  # its select returns: it exits at once
            try:
                watchdog.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                watchdog.kill()
                watchdog.wait(timeout=5.0)


def import_mpi() -> Any:
    """Import and return `mpi4py.MPI` (initialising MPI on first use).

    Raises:
        ImportError: mpi4py is not installed; the message names the
            `atomr[mpi]` extra.
    """
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise ImportError(
            f"the MPI backend needs mpi4py and an MPI library: pip install -e '.[mpi]' ({exc})"
        ) from exc
    return MPI


def open_communicators(
    comm: Any, timeout: float | None, check_order: bool
) -> tuple[Any, Any, Any, int]:
    """Start MPI and duplicate `comm` (default `COMM_WORLD`) twice, for the
    operations and for the failure notes, within a `StartupDeadline` of
    `timeout` (MPI's init and the duplications wait for every rank); then
    check that every rank has the same `check_order` (`_order.agree_on_check`).

    Returns:
        (`mpi4py.MPI`, the operations' communicator, the notes' communicator,
        the MPI's thread level); both communicators return errors.

    Raises:
        ImportError: mpi4py is not installed (`import_mpi`).
        RuntimeError: the MPI gives less than `MPI_THREAD_SERIALIZED` (calls
            from a worker thread would be unsafe).
        ValueError: the ranks disagree on `check_order`.
    """
    startup = StartupDeadline(timeout)
    mpi = import_mpi()
    level = mpi.Query_thread()
    if level < mpi.THREAD_SERIALIZED:
        raise RuntimeError(
            "MpiCollective runs MPI calls on a worker thread and needs "
            f"MPI_THREAD_SERIALIZED or better; this MPI gives level {level}"
        )
    base = mpi.COMM_WORLD if comm is None else comm
    ops, ctl = base.Dup(), base.Dup()
    agree_on_check(ctl, check_order)
    startup.done()
    for c in (ops, ctl):
        c.Set_errhandler(mpi.ERRORS_RETURN)
    return mpi, ops, ctl, level
