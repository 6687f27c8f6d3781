"""`watch_launcher`: a rank ends itself when the `atomr launch` that started it is gone.

The job runs in its own session, so a launcher killed with SIGKILL (which it
cannot catch to end the job) would leave every rank running, unseen.
`run_mpiexec` puts its pid in `LAUNCHER_PID_ENV`; a rank that calls
`watch_launcher` (every `MpiCollective` does) polls that pid from a daemon
thread and, once the process is gone, writes why to stderr and exits with
`LAUNCHER_GONE_EXIT_CODE` at once (`os._exit`: its MPI peers may be blocked in
a collective, so no clean shutdown is possible).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Mapping
from pathlib import Path

__all__ = ["LAUNCHER_GONE_EXIT_CODE", "LAUNCHER_PID_ENV", "watch_launcher"]

# The variable holding the pid of the `atomr launch` process that started the job.
LAUNCHER_PID_ENV = "ATOMR_LAUNCHER_PID"
# Exit code of a rank whose launcher is gone.
LAUNCHER_GONE_EXIT_CODE = 1

_started: set[int] = set()
_lock = threading.Lock()


def watch_launcher(env: Mapping[str, str] | None = None, poll_s: float = 1.0) -> bool:
    """Start (once per launcher pid) the thread that exits this process when
    the launcher named in `LAUNCHER_PID_ENV` is gone.

    Args:
        env: where to read `LAUNCHER_PID_ENV` (default: `os.environ`).
        poll_s: seconds between two checks of the launcher.

    Returns:
        True when a launcher is watched (now or already), False when the
        variable is absent or not a pid (a rank not started by `atomr launch`).
    """
    raw = (os.environ if env is None else env).get(LAUNCHER_PID_ENV, "")
    if not raw.isdigit() or int(raw) <= 1:
        return False
    pid = int(raw)
    with _lock:
        if pid not in _started:
            _started.add(pid)
            threading.Thread(
                target=_watch, args=(pid, poll_s), name="atomr-launcher-watchdog", daemon=True
            ).start()
    return True


def _watch(pid: int, poll_s: float) -> None:
    """Poll `pid`; exit this process once it is gone."""
    stop = threading.Event()  # never set: its wait is an interruptible sleep
    while _alive(pid):
        stop.wait(poll_s)
    print(
        f"atomr: the launcher (pid {pid}) is gone; rank {os.getpid()} exits",
        file=sys.stderr,
        flush=True,
    )
    os._exit(LAUNCHER_GONE_EXIT_CODE)


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, killed but not yet reaped, counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no procfs: trust the kill probe
    return stat.rpartition(")")[2].split()[:1] != ["Z"]
