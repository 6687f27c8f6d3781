"""Devices: names ("cuda:0", "cpu:1"), discovery, and logical CPU devices.

A ``Device`` is only a name; the memory and kernels of a device are reached
through ``atomr.accel.backend_for(device)``, and the device's worker thread
is owned by a ``DeviceActor``. On a machine without a GPU the CPU devices are
logical: each ``DeviceActor`` on ``cpu:N`` has its own worker thread (its
"stream"), and all of them share the host's cores.

Discovery never raises on a machine without CUDA. Under
``NUMBA_ENABLE_CUDASIM=1`` numba's simulator reports one device, ``cuda:0``.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Literal

from atomr._arguments import array_bytes

__all__ = [
    "Device",
    "cpu_devices",
    "cuda_available",
    "cuda_device_count",
    "cuda_is_simulated",
    "default_device",
    "list_devices",
    "training_devices",
]

DEFAULT_CPU_DEVICES = 2
"""Logical CPU devices a run uses by default when there is no GPU."""

DeviceKind = Literal["cpu", "cuda"]
_KINDS: tuple[str, ...] = ("cpu", "cuda")


@dataclass(frozen=True, order=True)
class Device:
    """One device: ``Device("cuda", 0)`` or ``Device("cpu", 1)``; ``str()`` gives "cuda:0".

    Args:
        kind: "cpu" or "cuda".
        index: the device number, >= 0. CPU devices are logical, any index is valid;
            a CUDA index is checked against the hardware when a backend is asked for.

    Raises:
        ValueError: unknown kind or negative index.
        TypeError: index is not an int.
    """

    kind: DeviceKind
    index: int = 0

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(
                f"unknown device kind {self.kind!r}: expected one of {', '.join(_KINDS)}"
            )
        if not isinstance(self.index, int) or isinstance(self.index, bool):
            raise TypeError(f"device index must be an int, got {type(self.index).__name__}")
        if self.index < 0:
            raise ValueError(f"device index must be >= 0, got {self.index}")

    @classmethod
    def parse(cls, name: str | Device) -> Device:
        """Parse a device name.

        Args:
            name: "cpu", "cpu:N", "cuda" or "cuda:N" (case-insensitive), or a Device
                (returned as is).

        Returns:
            The Device.

        Raises:
            ValueError: the name is not of that form (the message lists the accepted forms).
            TypeError: name is neither a str nor a Device.
        """
        if isinstance(name, Device):
            return name
        if not isinstance(name, str):
            raise TypeError(f"device name must be a str or Device, got {type(name).__name__}")
        text = name.strip().lower()
        kind, sep, idx = text.partition(":")
        if kind not in _KINDS or (sep and not (idx.isascii() and idx.isdigit())):
            raise ValueError(
                f"unknown device {name!r}: expected 'cpu', 'cpu:N', 'cuda' or 'cuda:N'"
            )
        return cls(kind, int(idx) if sep else 0)  # type: ignore[arg-type]

    @property
    def is_cuda(self) -> bool:
        """True for a CUDA device (real or simulated)."""
        return self.kind == "cuda"

    @property
    def is_cpu(self) -> bool:
        """True for a (logical) CPU device."""
        return self.kind == "cpu"

    def __str__(self) -> str:
        return f"{self.kind}:{self.index}"


def cuda_is_simulated() -> bool:
    """True when numba's CUDA simulator is on (``NUMBA_ENABLE_CUDASIM=1``)."""
    try:
        from numba import config
    except Exception:  # pragma: no cover - numba is a dependency
        return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")
    return bool(getattr(config, "ENABLE_CUDASIM", 0))


def cuda_available() -> bool:
    """True when numba.cuda can run kernels (a GPU with a driver, or the simulator).

    Never raises: any failure while probing the driver means "no CUDA".
    """
    try:
        from numba import cuda

        return bool(cuda.is_available())
    except Exception:
        return False


def cuda_device_count() -> int:
    """The number of CUDA devices numba can use (1 under the simulator, 0 without CUDA).

    Never raises.
    """
    if not cuda_available():
        return 0
    try:
        from numba import cuda

        return len(cuda.gpus)
    except Exception:
        return 0


_DEVICE_BYTES = 8 + sys.getsizeof(Device("cpu", 0))
"""What one listed `Device` takes at least: its pointer and the object."""


def cpu_devices(n: int) -> list[Device]:
    """``n`` logical CPU devices: cpu:0 .. cpu:n-1.

    Args:
        n: how many, >= 1.

    Returns:
        The devices, in index order.

    Raises:
        ValueError: n < 1 (or not an int), or more devices than a list can
            hold (`_arguments.array_bytes`), before any is made.
    """
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"cpu_devices(n) needs n >= 1, got {n!r}")
    array_bytes(f"a list of {n} cpu devices", n, _DEVICE_BYTES)
    return [Device("cpu", i) for i in range(n)]


def list_devices() -> list[Device]:
    """Every device of this machine: the CUDA devices (if any), then ``cpu:0``.

    More logical CPU devices are had with ``cpu_devices(n)``. Never raises.

    Returns:
        The devices, CUDA first.
    """
    return [Device("cuda", i) for i in range(cuda_device_count())] + [Device("cpu", 0)]


def default_device() -> Device:
    """The device trainers use when none is given: ``cuda:0`` on a real GPU, else ``cpu:0``.

    The CUDA simulator is never chosen by default (it is for tiny test shapes);
    ask for ``Device("cuda", 0)`` explicitly to use it.

    Returns:
        The device.
    """
    if not cuda_is_simulated() and cuda_device_count() > 0:
        return Device("cuda", 0)
    return Device("cpu", 0)


def training_devices() -> tuple[Device, ...]:
    """The devices a run uses by default: every CUDA device of this machine
    (the simulator does not count), else `DEFAULT_CPU_DEVICES` logical CPU
    devices (each with its own worker thread). Never raises."""
    gpus = 0 if cuda_is_simulated() else cuda_device_count()
    if gpus > 0:
        return tuple(Device("cuda", i) for i in range(gpus))
    return tuple(Device("cpu", i) for i in range(DEFAULT_CPU_DEVICES))
