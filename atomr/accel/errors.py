"""The GPU error family: what a device actor's failures look like to the rest of atomr.

Every failure that happens *on a device* (inside a kernel launch, a copy, or
any function run by ``DeviceActor.on_device``) reaches the caller as one of
these classes, so that supervision can decide on the error's kind alone
(see ``atomr.accel.supervision``). Input validation done before a launch is
not a device failure: it stays a ``ValueError`` / ``TypeError``.
"""

from __future__ import annotations

__all__ = [
    "ContextPoisoned",
    "DriverError",
    "GpuError",
    "KernelTimeout",
    "OutOfMemory",
    "Unrecoverable",
]


class GpuError(Exception):
    """Base class of every failure that happened on a device.

    Args:
        message: what went wrong, for people.
        device: the device name ("cuda:0", "cpu:1") where it happened, if known.
    """

    def __init__(self, message: str, device: str | None = None) -> None:
        super().__init__(message if device is None else f"[{device}] {message}")
        self.device = device


class ContextPoisoned(GpuError):
    """The device context is corrupt (a sticky CUDA error such as an illegal address).

    Nothing more can run in this context: the supervisor restarts the actor,
    which builds a fresh context and re-uploads its state.
    """


class OutOfMemory(GpuError):
    """An allocation failed on the device (or host memory ran out for a CPU device).

    The context is still valid: the supervisor resumes the actor, keeping its state.
    """


class Unrecoverable(GpuError):
    """The device itself failed (ECC error, device lost): the supervisor stops the actor."""


class DriverError(GpuError):
    """The driver (or an unexpected exception inside device work) failed.

    The original exception is chained as ``__cause__``.
    """


class KernelTimeout(GpuError):
    """A kernel ran past the driver's watchdog (CUDA_ERROR_LAUNCH_TIMEOUT)."""
