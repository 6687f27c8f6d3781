"""The process-wide locks of kernel launches.

The simulator runs a launch as one Python thread per CUDA thread and cannot
run two launches at once; several device actors (each with its own worker
thread) would otherwise interleave them: `SIM_LOCK` is held around every
launch and copy while it is on (`launch_lock`). On a real GPU, numba-cuda
loads a kernel's module into the context on its first launch, and two
threads launching the same kernel at once (two device actors on one
device) fail there ("key already in dictionary"): `GPU_LAUNCH_LOCK` is held
around each kernel launch (`kernel_launch`), not around copies or waits.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from atomr.accel.device import cuda_is_simulated

__all__ = ["GPU_LAUNCH_LOCK", "SIM_LOCK", "kernel_launch", "launch_lock"]

SIM_LOCK = threading.RLock()
"""The lock held around every launch (and copy) while the simulator is on."""

GPU_LAUNCH_LOCK = threading.Lock()
"""The lock held around each kernel launch on a real GPU (a launch is queued,
not waited for: it is held for microseconds)."""


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


@contextlib.contextmanager
def kernel_launch() -> Iterator[None]:
    """Hold the lock of one kernel launch: ``SIM_LOCK`` under the simulator,
    ``GPU_LAUNCH_LOCK`` on a real GPU.

    Yields:
        None.
    """
    with SIM_LOCK if cuda_is_simulated() else GPU_LAUNCH_LOCK:
        yield
