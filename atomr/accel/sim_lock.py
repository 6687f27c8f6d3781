"""One process-wide lock for kernel launches under numba's CUDA simulator.

The simulator runs a launch as one Python thread per CUDA thread and cannot
run two launches at once; several device actors (each with its own worker
thread) would otherwise interleave them. On a real GPU the lock is not taken.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from atomr.accel.device import cuda_is_simulated

__all__ = ["SIM_LOCK", "launch_lock"]

SIM_LOCK = threading.RLock()
"""The lock held around every launch (and copy) while the simulator is on."""


@contextlib.contextmanager
def launch_lock() -> Iterator[None]:
    """Hold ``SIM_LOCK`` for the duration of a launch when the simulator is on; else do nothing.

    Yields:
        None.
    """
    if cuda_is_simulated():
        with SIM_LOCK:
            yield
    else:
        yield
