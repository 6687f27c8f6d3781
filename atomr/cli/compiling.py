"""`say_when_compiling`: a first run says that it is compiling kernels.

numba compiles the CPU kernels on their first call and caches them on disk;
a first run spends tens of seconds there, while the progress bar would show
a wild ETA. numba broadcasts a `numba:compile` event only when a kernel is
not found in its cache: the first one prints a notice line on stderr.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from typing import Any, TextIO

from numba.core import event

__all__ = ["COMPILING_NOTICE", "say_when_compiling"]

COMPILING_NOTICE = (
    "atomr: compiling kernels (first run: this takes a while; they are cached for the next runs)"
)


class _FirstCompileNotice(event.Listener):
    """Writes the notice once, at the start of the first compile (any thread)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._said = False
        self._lock = threading.Lock()

    def on_start(self, ev: Any) -> None:
        with self._lock:
            if self._said:
                return
            self._said = True
        try:
            from tqdm import tqdm
        except ImportError:
            print(COMPILING_NOTICE, file=self._stream, flush=True)
        else:  # clears and redraws a progress bar around the line
            tqdm.write(COMPILING_NOTICE, file=self._stream)

    def on_end(self, ev: Any) -> None:
        pass


@contextlib.contextmanager
def say_when_compiling(enabled: bool = True, stream: TextIO | None = None) -> Iterator[None]:
    """Within the block, the first kernel compile (a numba cache miss)
    prints `COMPILING_NOTICE` on `stream` (default: stderr), once.

    Args:
        enabled: False to say nothing (`--quiet`).
        stream: where to write.
    """
    if not enabled:
        yield
        return
    listener = _FirstCompileNotice(stream if stream is not None else sys.stderr)
    event.register("numba:compile", listener)
    try:
        yield
    finally:
        event.unregister("numba:compile", listener)
