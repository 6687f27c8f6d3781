"""How kernels are compiled: one scalar function, two targets.

``cpu_scalar`` / ``gpu_scalar`` compile a plain Python function as a numba
njit function and as a numba.cuda device function; ``cpu_loop`` compiles a
CPU twin (GIL released, cached on disk); ``gpu_kernel`` compiles a CUDA
kernel (cached on disk where numba.cuda supports it). ``launch_1d`` /
``launch_2d`` pick a grid and launch under the launch lock (`sim_lock`).

Nothing here touches the CUDA driver at import time: numba.cuda compiles
lazily, on the first launch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numba

from atomr.accel.device import cuda_is_simulated
from atomr.accel.sim_lock import kernel_launch


class _CudaUnavailable:
    """Stands in for ``numba.cuda`` when importing it fails (a broken CUDA setup).

    Decorating still works (so the CPU twins import); using a CUDA kernel or
    allocating device memory raises RuntimeError naming the import error.
    """

    def __init__(self, error: Exception) -> None:
        self.error = error

    def is_available(self) -> bool:
        return False

    def jit(self, *args: Any, **kwargs: Any) -> Any:
        if args and callable(args[0]):
            return self
        return lambda fn: self

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"numba.cuda is unavailable: {self.error}")

    def __getitem__(self, launch: Any) -> Any:
        raise RuntimeError(f"numba.cuda is unavailable: {self.error}")


try:
    from numba import cuda
except Exception as _exc:  # e.g. NUMBA_CUDA_DRIVER pointing nowhere
    cuda = _CudaUnavailable(_exc)  # type: ignore[assignment]

__all__ = [
    "cuda",
    "BLOCK",
    "MAX_BLOCKS",
    "MAX_GRID_Y",
    "SIMULATED",
    "TILE",
    "cache_dir_of",
    "cpu_loop",
    "cpu_math_loop",
    "cpu_reduce_loop",
    "cpu_scalar",
    "gpu_kernel",
    "gpu_scalar",
    "launch_1d",
    "launch_2d",
]

SIMULATED: bool = cuda_is_simulated()
"""True under NUMBA_ENABLE_CUDASIM=1: small blocks, since every CUDA thread is a Python thread."""

BLOCK: int = 32 if SIMULATED else 256
"""Threads per block of the 1-D kernels (a power of two: the block reductions halve it)."""

MAX_BLOCKS: int = 4 if SIMULATED else 1024
"""Upper bound on blocks of a 1-D launch; the kernels use grid-stride loops."""

TILE: int = 4 if SIMULATED else 16
"""Side of the square shared-memory tile of the matmul kernel (and of 2-D blocks)."""

MAX_GRID_Y: int = 2 if SIMULATED else 65535
"""Upper bound on the row blocks of a 2-D launch (CUDA refuses a grid taller
than 65535 blocks); the 2-D kernels loop over row blocks with a stride of
``gridDim.y`` (2 under the simulator, so that tiny shapes run the loop)."""


def cpu_scalar(fn: Callable[..., Any]) -> Any:
    """Compile a scalar function for the CPU (numba.njit, inlined into its callers).

    Args:
        fn: a plain Python function using only numba-supported math.

    Returns:
        The njit dispatcher.
    """
    return numba.njit(inline="always")(fn)


def _cached(jit: Callable[..., Any], fn: Callable[..., Any], **options: Any) -> Any:
    """``jit(cache=True, **options)(fn)``; without the disk cache when numba
    finds no folder it can write it to (``NUMBA_CACHE_DIR``, ``__pycache__``
    beside the kernels, the user's cache folder), so that atomr still imports
    there and each process compiles its kernels (``cache_dir_of`` is then None).

    Raises:
        RuntimeError: any other error numba raises while setting up the cache.
    """
    try:
        return jit(cache=True, **options)(fn)
    except RuntimeError as error:
        if "no locator available" not in str(error):
            raise
        return jit(**options)(fn)


def cache_dir_of(kernel: Any) -> str | None:
    """The folder numba caches a compiled kernel's machine code in.

    Args:
        kernel: a dispatcher made by ``cpu_loop`` (or a sibling).

    Returns:
        ``NUMBA_CACHE_DIR``, or the fallback numba chose when that cannot
        be written; None when nothing can be cached.
    """
    path = getattr(getattr(kernel, "_cache", None), "cache_path", None)
    return str(path) if path else None


def gpu_scalar(fn: Callable[..., Any]) -> Any:
    """Compile a scalar function as a numba.cuda device function.

    Args:
        fn: the same plain Python function given to ``cpu_scalar``.

    Returns:
        The device function.
    """
    return cuda.jit(device=True)(fn)


def cpu_loop(fn: Callable[..., Any]) -> Any:
    """Compile a CPU twin: ``numba.njit(nogil=True, cache=True)``.

    Args:
        fn: the loop.

    Returns:
        The njit dispatcher (compiled lazily per signature, cached on disk).
    """
    return _cached(numba.njit, fn, nogil=True, error_model="numpy")


def cpu_math_loop(fn: Callable[..., Any]) -> Any:
    """Compile a transcendental-heavy CPU twin: like ``cpu_loop`` plus FMA contraction.

    ``contract`` lets LLVM fuse ``a * b + c`` into one FMA (one rounding
    instead of two): fewer instructions in the polynomial evaluations of
    ``_fastmath``, results within float32 rounding of the unfused ones.

    Args:
        fn: the loop.

    Returns:
        The njit dispatcher.
    """
    return _cached(numba.njit, fn, nogil=True, error_model="numpy", fastmath={"contract"})


def cpu_reduce_loop(fn: Callable[..., Any]) -> Any:
    """Compile a CPU reduction twin: like ``cpu_loop`` plus fastmath reassociation.

    Reassociating the sum lets LLVM vectorise it; the result differs from a
    sequential sum only by rounding.

    Args:
        fn: the loop.

    Returns:
        The njit dispatcher.
    """
    return _cached(numba.njit, fn, nogil=True, error_model="numpy", fastmath={"reassoc", "nsz"})


def gpu_kernel(fn: Callable[..., Any]) -> Any:
    """Compile a CUDA kernel (``numba.cuda.jit(cache=True)``), lazily.

    Args:
        fn: the kernel body.

    Returns:
        The CUDA dispatcher.
    """
    return _cached(cuda.jit, fn)


def blocks_for(n: int) -> int:
    """Blocks of a 1-D grid-stride launch over ``n`` items.

    Args:
        n: number of items, >= 1.

    Returns:
        The block count, between 1 and MAX_BLOCKS.
    """
    return max(1, min(MAX_BLOCKS, (n + BLOCK - 1) // BLOCK))


def launch_1d(kernel: Any, n: int, *args: Any) -> None:
    """Launch a 1-D grid-stride kernel over ``n`` items (nothing when n == 0).

    Args:
        kernel: a ``gpu_kernel``.
        n: number of items.
        *args: the kernel's arguments.
    """
    if n <= 0:
        return
    with kernel_launch():
        kernel[blocks_for(n), BLOCK](*args)


def launch_2d(kernel: Any, rows: int, cols: int, *args: Any) -> None:
    """Launch a 2-D kernel with TILE x TILE blocks covering ``cols`` and at
    most ``MAX_GRID_Y`` blocks of rows: the kernel loops over row blocks, the
    next one ``gridDim.y`` blocks further down.

    Thread x runs along columns, y along rows.

    Args:
        kernel: a ``gpu_kernel``.
        rows: the output's rows.
        cols: the output's columns.
        *args: the kernel's arguments.
    """
    if rows <= 0 or cols <= 0:
        return
    grid = ((cols + TILE - 1) // TILE, min(MAX_GRID_Y, (rows + TILE - 1) // TILE))
    with kernel_launch():
        kernel[grid, (TILE, TILE)](*args)
