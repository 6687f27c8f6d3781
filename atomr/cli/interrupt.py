"""`stop_on_sigint`: Ctrl-C ends a run cleanly between steps (it sets a
`StopFlag`); a second Ctrl-C ends the process at once."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType

from atomr.train.fit import StopFlag

__all__ = ["SECOND_CTRL_C_HINT", "stop_on_sigint"]

SECOND_CTRL_C_HINT = "atomr: stopping after this step; press Ctrl-C again to quit at once"


@contextlib.contextmanager
def stop_on_sigint(flag: StopFlag) -> Iterator[None]:
    """Within the block, the first SIGINT (Ctrl-C) sets `flag` and prints
    `SECOND_CTRL_C_HINT` on stderr; a second one ends the process at once,
    whatever it is doing.

    The second Ctrl-C gets the operating system's default action (the
    process is killed by SIGINT): no Python code runs, so neither worker
    threads stuck in numba's compile locks nor a busy event loop can delay
    it. After a first Ctrl-C that default stays in force past the block.
    Outside the main thread the block runs with Python's default handling.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # the next Ctrl-C kills
        flag.request()
        # os.write: a signal handler must not re-enter sys.stderr's buffer
        os.write(2, f"\n{SECOND_CTRL_C_HINT}\n".encode())

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGINT) is on_sigint:  # not pressed: put back
            signal.signal(signal.SIGINT, previous)
