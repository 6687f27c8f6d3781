"""The shared CPU backend used for host-side math (`LossKind.compute`, default models)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from atomr.accel import Device, backend_for

__all__ = ["cpu_backend"]


@lru_cache(maxsize=1)
def cpu_backend() -> Any:
    """The kernels of device "cpu:0" (`atomr.accel.backend_for`)."""
    return backend_for(Device.parse("cpu:0"))
