"""How the `atomr` command meets Ctrl-C (SIGINT) and SIGTERM, all in one place.

`stop_on_signals`: during a run, either ends it cleanly between steps (it
sets a `StopFlag`); once training is over, the outputs are written first; a
second one ends the process at once. `sigterm_interrupts`: at any other
point (start-up: imports, data, warm-up), SIGTERM raises `Terminated`, a
`KeyboardInterrupt`, as Ctrl-C raises one, so that `main` ends either in
one line (`interruption`: exit status 143 or 130) and nothing is left
half-written. `signals_kill`: while a rank of a `--distributed` job that
was interrupted so tells the others, a second signal ends it at once.

This module imports nothing heavy: `app` uses it before the training layer
is loaded."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from atomr.train.fit import StopFlag

__all__ = [
    "SECOND_CTRL_C_HINT",
    "SECOND_SIGTERM_HINT",
    "STOPPING_SIGNALS",
    "WRITING_HINT",
    "Terminated",
    "interruption",
    "signals_kill",
    "sigterm_interrupts",
    "stop_on_signals",
]

SECOND_CTRL_C_HINT = "atomr: stopping after this step; press Ctrl-C again to quit at once"
SECOND_SIGTERM_HINT = (
    "atomr: SIGTERM: stopping after this step; a second SIGTERM or Ctrl-C quits at once"
)
"""What a first SIGTERM prints: its sender may be no terminal's user."""
WRITING_HINT = (
    "atomr: {signal}: training is over: writing its outputs first; {again} quits at once, "
    "without them"
)
"""What a first signal prints once training is over (`{signal}`: its name;
`{again}`: what quits at once)."""

STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""Ctrl-C, and what `kill`, `docker stop` and cluster schedulers send."""


class Terminated(KeyboardInterrupt):
    """SIGTERM outside a run's `stop_on_signals` block (`sigterm_interrupts`):
    it unwinds as a Ctrl-C there does (a `KeyboardInterrupt`), and the
    command exits with status 143 (128 + SIGTERM)."""


def interruption(interrupt: KeyboardInterrupt) -> tuple[str, int]:
    """How the command reports `interrupt` (a Ctrl-C, or SIGTERM's
    `Terminated`) outside a run: its line and its exit status
    ("interrupted (SIGTERM)" and 143, "interrupted" and 130)."""
    if isinstance(interrupt, Terminated):
        return "interrupted (SIGTERM)", 128 + signal.SIGTERM
    return "interrupted", 128 + signal.SIGINT


@contextlib.contextmanager
def signals_kill() -> Iterator[None]:
    """Within the block, SIGINT (Ctrl-C) and SIGTERM get the operating
    system's default action: after the signal being handled (which
    interrupted the command), a second one ends the process at once, as it
    does in `stop_on_signals`. Their handlers are put back after the block.
    Outside the main thread, the block changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {each: signal.signal(each, signal.SIG_DFL) for each in STOPPING_SIGNALS}
    try:
        yield
    finally:
        for each, handler in previous.items():
            signal.signal(each, handler)


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Within the block, SIGTERM raises `Terminated` where the main thread is
    (as Python's own handler raises `KeyboardInterrupt` for SIGINT), instead
    of killing the process without a word. A `stop_on_signals` block inside
    takes both signals over for a run, and hands SIGTERM back when none came.

    SIGTERM keeps its handler when it is not the default (ignored by the
    process that started this one, say), and outside the main thread.

    Raises:
        Terminated: a SIGTERM came within the block (from where the main
            thread was).
    """
    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        raise Terminated

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # what it was


@contextlib.contextmanager
def stop_on_signals(
    flag: StopFlag, received: list[int], over: Callable[[], bool] = lambda: False
) -> Iterator[None]:
    """Within the block, the first SIGINT (Ctrl-C) or SIGTERM sets `flag` and
    prints `SECOND_CTRL_C_HINT` (`SECOND_SIGTERM_HINT` for SIGTERM) on
    stderr; a second one ends the process at once, whatever it is doing.
    Once `over()` is true (training is over: the block goes on to write its
    outputs), the first prints `WRITING_HINT` instead, and the block goes on:
    the results of a finished run are not lost to a late signal.

    Each signal that comes is appended to `received` (the caller of a run
    it stopped exits with 128 + the first, as a shell reports a process that
    signal ended).

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
        hint = _hint(signum, over())
        # os.write: a signal handler must not re-enter sys.stderr's buffer
        os.write(2, f"\n{hint}\n".encode())

    previous = {each: signal.signal(each, on_signal) for each in STOPPING_SIGNALS}
    try:
        yield
    finally:
        if not received:  # none came: put the handlers back
            for each, handler in previous.items():
                signal.signal(each, handler)


def _hint(signum: int, over: bool) -> str:
    """What a first signal `signum` prints; `over`: training is over."""
    term = signum == signal.SIGTERM
    if over:
        again = "a second SIGTERM or Ctrl-C" if term else "Ctrl-C again"
        return WRITING_HINT.format(signal="SIGTERM" if term else "Ctrl-C", again=again)
    return SECOND_SIGTERM_HINT if term else SECOND_CTRL_C_HINT
