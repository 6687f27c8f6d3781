"""`stop_on_signals`: Ctrl-C (SIGINT) or SIGTERM ends a run cleanly between
steps (it sets a `StopFlag`); a second one ends the process at once."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType

from atomr.train.fit import StopFlag

__all__ = ["SECOND_CTRL_C_HINT", "SECOND_SIGTERM_HINT", "STOPPING_SIGNALS", "stop_on_signals"]

SECOND_CTRL_C_HINT = "atomr: stopping after this step; press Ctrl-C again to quit at once"
SECOND_SIGTERM_HINT = (
    "atomr: SIGTERM: stopping after this step; a second SIGTERM or Ctrl-C quits at once"
)
"""What a first SIGTERM prints: its sender may be no terminal's user."""

STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""Ctrl-C, and what `kill`, `docker stop` and cluster schedulers send."""


@contextlib.contextmanager
def stop_on_signals(flag: StopFlag, received: list[int]) -> Iterator[None]:
    """Within the block, the first SIGINT (Ctrl-C) or SIGTERM sets `flag` and
    prints `SECOND_CTRL_C_HINT` (`SECOND_SIGTERM_HINT` for SIGTERM) on
    stderr; a second one ends the process at once, whatever it is doing.

    Each signal that comes is appended to `received` (the caller exits with
    128 + the first, as a shell reports a process that signal ended).

    The second signal gets the operating system's default action (the
    process is killed by it): no Python code runs, so neither worker threads
    stuck in numba's compile locks nor a busy event loop can delay it. After
    a first signal that default stays in force past the block. Outside the
    main thread the block runs with Python's default handling.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_signal(signum: int, frame: FrameType | None) -> None:
        for each in STOPPING_SIGNALS:  # the next one kills
            signal.signal(each, signal.SIG_DFL)
        received.append(signum)
        flag.request()
        hint = SECOND_SIGTERM_HINT if signum == signal.SIGTERM else SECOND_CTRL_C_HINT
        # os.write: a signal handler must not re-enter sys.stderr's buffer
        os.write(2, f"\n{hint}\n".encode())

    previous = {each: signal.signal(each, on_signal) for each in STOPPING_SIGNALS}
    try:
        yield
    finally:
        if not received:  # none came: put the handlers back
            for each, handler in previous.items():
                signal.signal(each, handler)
