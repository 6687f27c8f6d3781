"""`stop_on_sigint`: Ctrl-C ends a run cleanly between steps (it sets a `StopFlag`)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Iterator

from atomr.train.fit import StopFlag

__all__ = ["stop_on_sigint"]


@contextlib.contextmanager
def stop_on_sigint(flag: StopFlag) -> Iterator[None]:
    """Within the block, the first SIGINT (Ctrl-C) sets `flag` instead of
    raising; a second one interrupts at once (KeyboardInterrupt).

    Must be entered inside a running event loop. Where the loop cannot take
    signal handlers (not the main thread, or Windows) the block runs with
    Python's default handling.
    """
    loop = asyncio.get_running_loop()

    def on_sigint() -> None:
        if flag.requested:
            loop.remove_signal_handler(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
            return
        flag.request()

    try:
        loop.add_signal_handler(signal.SIGINT, on_sigint)
    except (NotImplementedError, RuntimeError, ValueError):
        yield
        return
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGINT)
