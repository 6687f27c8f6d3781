"""`cuda_target`: which numba CUDA target is installed, and which driver it found.

numba's built-in CUDA target is deprecated; the maintained one is the
`numba-cuda` package (`pip install -e '.[cuda]'`), which takes over
`numba.cuda` when installed. `atomr devices` reports this.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass

from atomr.accel.device import cuda_available, cuda_is_simulated

__all__ = ["CudaTarget", "cuda_target"]


@dataclass(frozen=True)
class CudaTarget:
    """What CUDA support is there.

    Attributes:
        target: "numba-cuda <version>", or "numba's built-in target (deprecated)".
        maintained: True with the numba-cuda package.
        driver: the CUDA driver version ("12.4"), "simulator", or None when
            there is no usable driver.
        note: why there is none, or what to install.
    """

    target: str
    maintained: bool
    driver: str | None
    note: str


def _numba_cuda_version() -> str | None:
    try:
        return importlib.metadata.version("numba-cuda")
    except importlib.metadata.PackageNotFoundError:
        return None


def _driver_version() -> str | None:
    try:
        from numba import cuda

        major, minor = cuda.cudadrv.driver.driver.get_version()  # type: ignore[attr-defined]
    except Exception:
        return None
    return f"{major}.{minor}"


def cuda_target() -> CudaTarget:
    """Probe the CUDA target and driver (never raises)."""
    version = _numba_cuda_version()
    target = f"numba-cuda {version}" if version else "numba's built-in target (deprecated)"
    hint = "" if version else "; pip install -e '.[cuda]' for the maintained numba-cuda"
    if cuda_is_simulated():
        return CudaTarget(target, bool(version), "simulator", "NUMBA_ENABLE_CUDASIM=1" + hint)
    if not cuda_available():
        return CudaTarget(target, bool(version), None, "no CUDA driver or GPU found" + hint)
    driver = _driver_version()
    return CudaTarget(target, bool(version), driver, "ready" + hint)
