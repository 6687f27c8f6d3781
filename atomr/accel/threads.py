"""BLAS thread sharing among the live CPU device actors.

Each CPU device actor runs its kernels on its own worker thread; matmuls go
to BLAS, which has its own thread pool. With N live CPU device actors on C
cores, BLAS gets ``max(1, C // N)`` threads, so N concurrent matmuls do not
oversubscribe the cores. The limit is recomputed whenever a CPU device actor
starts or stops, and BLAS's original setting is restored when none is left.
"""

from __future__ import annotations

import os
import threading

from threadpoolctl import ThreadpoolController

__all__ = ["BLAS_SHARE", "BlasThreadShare", "available_cores", "blas_threads"]


def available_cores() -> int:
    """The cores this process may run on (affinity-aware), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def blas_threads() -> int | None:
    """The thread count of NumPy's BLAS (the one ``np.matmul`` uses).

    Other BLAS libraries (numba loads scipy's OpenBLAS when it compiles) are
    limited too whenever a CPU device actor starts or stops, but only NumPy's
    serves the matmul kernels.

    Returns:
        The count, or None when NumPy's BLAS is not found (then the largest count
        over the loaded BLAS libraries, or None when there is none).
    """
    infos = [i for i in ThreadpoolController().info() if i["user_api"] == "blas"]
    numpy_libs = [int(i["num_threads"]) for i in infos if "numpy" in str(i["filepath"])]
    if numpy_libs:
        return max(numpy_libs)
    counts = [int(i["num_threads"]) for i in infos]
    return max(counts) if counts else None


class BlasThreadShare:
    """Counts live CPU device actors and sets BLAS's thread count to cores // live.

    Args:
        cores: the cores to share (default: ``available_cores()``).

    Thread-safe: ``acquire`` / ``release`` may be called from any thread.
    """

    def __init__(self, cores: int | None = None) -> None:
        self.cores = cores if cores is not None else available_cores()
        self._lock = threading.Lock()
        self._live = 0
        self._original: dict[str, int] = {}  # BLAS library -> its threads before the first device

    @property
    def live(self) -> int:
        """The number of live CPU device actors."""
        return self._live

    def threads_per_device(self) -> int:
        """``max(1, cores // live)`` (cores when none is live)."""
        return max(1, self.cores // max(1, self._live))

    def acquire(self) -> int:
        """Register one more live CPU device actor and re-limit BLAS.

        Returns:
            The BLAS threads each device now gets.
        """
        with self._lock:
            self._live += 1
            self._apply()
            return self.threads_per_device()

    def release(self) -> None:
        """Unregister a CPU device actor; restore BLAS's own setting when none is left."""
        with self._lock:
            self._live = max(0, self._live - 1)
            self._apply()

    def _apply(self) -> None:
        # A fresh controller each time: BLAS libraries loaded since the last call
        # (scipy brings its own OpenBLAS) are limited too.
        libs = ThreadpoolController().select(user_api="blas").lib_controllers
        for lib in libs:
            self._original.setdefault(lib.filepath, lib.num_threads)
        if self._live == 0:
            for lib in libs:
                lib.set_num_threads(self._original.get(lib.filepath, lib.num_threads))
            self._original.clear()
            return
        for lib in libs:
            lib.set_num_threads(self.threads_per_device())


BLAS_SHARE = BlasThreadShare()
"""The process-wide share used by ``DeviceActor``."""
