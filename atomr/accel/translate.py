"""Turn an exception raised by device work into the GpuError it means.

Used by ``DeviceActor.on_device``. The rules:

- a ``GpuError`` stays as it is;
- ``ValueError`` / ``TypeError`` stay as they are (input validation, done
  before any launch, is the caller's mistake, not the device's);
- ``MemoryError`` and CUDA out-of-memory -> ``OutOfMemory``;
- sticky CUDA errors (illegal address, launch failure, misaligned address,
  illegal instruction, ...) -> ``ContextPoisoned``;
- CUDA launch timeout -> ``KernelTimeout``;
- ECC / device-lost errors -> ``Unrecoverable``;
- any other exception -> ``DriverError``.

The original exception is always chained as ``__cause__``.
"""

from __future__ import annotations

from atomr.accel.errors import (
    ContextPoisoned,
    DriverError,
    GpuError,
    KernelTimeout,
    OutOfMemory,
    Unrecoverable,
)

__all__ = ["translate_error"]

# CUDA driver error codes (cuda.h, CUresult)
_OOM = {2}  # CUDA_ERROR_OUT_OF_MEMORY
_TIMEOUT = {702}  # CUDA_ERROR_LAUNCH_TIMEOUT
# illegal address .. launch failed: sticky errors that leave the context unusable.
# Not 701 (CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES): a launch refused for its
# configuration (threads per block against the kernel's registers) leaves the
# context intact, so it stays a DriverError and the actor keeps its state
_POISONED = {700, 714, 715, 716, 717, 718, 719}
_UNRECOVERABLE = {214, 220, 46, 999}  # ECC, NVLink uncorrectable, device unavailable, unknown


def _cuda_code(exc: BaseException) -> int | None:
    """The CUresult code of a numba CudaAPIError, or None."""
    code = getattr(exc, "code", None)
    if isinstance(code, int):
        return code
    value = getattr(code, "value", None)
    return value if isinstance(value, int) else None


def translate_error(exc: BaseException, device: str | None = None) -> BaseException:
    """The exception the caller of device work should see for ``exc``.

    Args:
        exc: what the device work raised.
        device: the device's name, added to the message of a new GpuError.

    Returns:
        ``exc`` itself (GpuError, ValueError, TypeError, or not an ``Exception``
        such as cancellation), or a new GpuError subclass with ``exc`` as its
        ``__cause__``.
    """
    if not isinstance(exc, Exception) or isinstance(exc, GpuError | ValueError | TypeError):
        return exc
    kind: type[GpuError] = DriverError
    if isinstance(exc, MemoryError):
        kind = OutOfMemory
    else:
        code = _cuda_code(exc)
        text = str(exc).upper()
        if code in _OOM or "CUDA_ERROR_OUT_OF_MEMORY" in text:
            kind = OutOfMemory
        elif code in _TIMEOUT or "CUDA_ERROR_LAUNCH_TIMEOUT" in text:
            kind = KernelTimeout
        elif code in _POISONED or "CUDA_ERROR_ILLEGAL_ADDRESS" in text:
            kind = ContextPoisoned
        elif code in _UNRECOVERABLE or "CUDA_ERROR_ECC_UNCORRECTABLE" in text:
            kind = Unrecoverable
    error = kind(f"{type(exc).__name__}: {exc}", device)
    error.__cause__ = exc
    return error
