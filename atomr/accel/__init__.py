"""atomr.accel: devices, the GPU error family, kernels and the device actor.

Every numerical op exists as a numba.cuda kernel and as a CPU twin; a
``Backend`` (``backend_for(device)``) exposes them for one device, and a
``DeviceActor`` owns one device and the worker thread its work runs on.
See docs/devices.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from atomr.accel.backend import ACTIVATIONS, Backend, backend_for
from atomr.accel.cpu_backend import CpuBackend
from atomr.accel.device import (
    Device,
    cpu_devices,
    cuda_available,
    cuda_device_count,
    cuda_is_simulated,
    default_device,
    list_devices,
    training_devices,
)
from atomr.accel.errors import (
    ContextPoisoned,
    DriverError,
    GpuError,
    KernelTimeout,
    OutOfMemory,
    Unrecoverable,
)
from atomr.accel.hyperparameters import AdamHyperparameters, SgdHyperparameters
from atomr.accel.translate import translate_error

if TYPE_CHECKING:
    from atomr.accel.cuda_backend import CudaBackend
    from atomr.accel.device_actor import DeviceActor
    from atomr.accel.supervision import device_supervisor_strategy

__all__ = [
    "ACTIVATIONS",
    "AdamHyperparameters",
    "Backend",
    "ContextPoisoned",
    "CpuBackend",
    "CudaBackend",
    "Device",
    "DeviceActor",
    "DriverError",
    "GpuError",
    "KernelTimeout",
    "OutOfMemory",
    "SgdHyperparameters",
    "Unrecoverable",
    "backend_for",
    "cpu_devices",
    "cuda_available",
    "cuda_device_count",
    "cuda_is_simulated",
    "default_device",
    "device_supervisor_strategy",
    "list_devices",
    "training_devices",
    "translate_error",
]

_LAZY = {
    "CudaBackend": "atomr.accel.cuda_backend",
    "DeviceActor": "atomr.accel.device_actor",
    "device_supervisor_strategy": "atomr.accel.supervision",
}


def __getattr__(name: str) -> Any:
    """Import the names that need atomr.actor (or numba.cuda launchers) on first use."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'atomr.accel' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
