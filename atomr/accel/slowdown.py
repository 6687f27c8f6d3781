"""`slow_down`: make a logical CPU device slower, for tests and benchmarks only.

Heterogeneous devices (a slow GPU beside a fast one) are what the
data-parallel cadence policy is for; on a machine of identical cores they are
made by slowing one logical device: after each of its jobs, its worker thread
sleeps `(factor - 1)` times the job's own time, so the device takes `factor`
times as long in wall time (and the sleep leaves the core to the others).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TypeVar

from atomr.accel.device import Device

__all__ = ["slow_down", "slowdown_factor", "slowed"]

T = TypeVar("T")

_FACTORS: dict[Device, float] = {}


def slow_down(device: Device | str, factor: float) -> None:
    """Make `device`'s jobs take `factor` times as long (1: back to normal).

    Applies to the device actors of that device started from now on, in this
    process. For tests and benchmarks; never in production.

    Raises:
        ValueError: a CUDA device, or a factor below 1 or not finite.
    """
    dev = Device.parse(device)
    if dev.is_cuda:
        raise ValueError("slow_down applies to logical CPU devices only")
    if not (math.isfinite(factor) and factor >= 1.0):
        raise ValueError(f"factor must be finite and >= 1, got {factor}")
    if factor == 1.0:
        _FACTORS.pop(dev, None)
    else:
        _FACTORS[dev] = float(factor)


def slowdown_factor(device: Device) -> float:
    """The factor set for `device` (1.0: none)."""
    return _FACTORS.get(device, 1.0)


def slowed(job: Callable[[], T], factor: float) -> Callable[[], T]:
    """`job`, followed by a sleep of `(factor - 1)` times its own time."""

    def run() -> T:
        started = time.perf_counter()
        try:
            return job()
        finally:
            time.sleep((factor - 1.0) * (time.perf_counter() - started))

    return run
