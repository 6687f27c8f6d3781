"""The GpuError family and how device-work exceptions are translated into it."""

from __future__ import annotations

import pytest

from atomr.accel import (
    ContextPoisoned,
    DriverError,
    GpuError,
    KernelTimeout,
    OutOfMemory,
    Unrecoverable,
    translate_error,
)
from atomr.accel import errors as accel_errors
from atomr.accel.device import cuda_is_simulated


class FakeCudaAPIError(Exception):
    """Shaped like numba's CudaAPIError: a CUresult ``code`` attribute."""

    def __init__(self, code: int, msg: str) -> None:
        super().__init__(msg)
        self.code = code


def test_family():
    for cls in (
        ContextPoisoned,
        OutOfMemory,
        Unrecoverable,
        DriverError,
        KernelTimeout,
    ):
        assert issubclass(cls, GpuError)
    err = OutOfMemory("no room", device="cuda:1")
    assert err.device == "cuda:1" and "cuda:1" in str(err)


TRANSLATIONS = [
    (MemoryError("host"), OutOfMemory),
    (
        FakeCudaAPIError(2, "[2] Call to cuMemAlloc results in CUDA_ERROR_OUT_OF_MEMORY"),
        OutOfMemory,
    ),
    (FakeCudaAPIError(700, "CUDA_ERROR_ILLEGAL_ADDRESS"), ContextPoisoned),
    (FakeCudaAPIError(719, "CUDA_ERROR_LAUNCH_FAILED"), ContextPoisoned),
    (FakeCudaAPIError(702, "CUDA_ERROR_LAUNCH_TIMEOUT"), KernelTimeout),
    # a launch refused for its configuration: the context is intact, so the
    # actor keeps its state (a restart would wipe it and fail the same way)
    (FakeCudaAPIError(701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"), DriverError),
    (FakeCudaAPIError(214, "CUDA_ERROR_ECC_UNCORRECTABLE"), Unrecoverable),
    (FakeCudaAPIError(1, "CUDA_ERROR_INVALID_VALUE"), DriverError),
    (KeyError("surprise"), DriverError),
    (ZeroDivisionError("x"), DriverError),
]


@pytest.mark.parametrize("exc,expected", TRANSLATIONS)
def test_translate_maps_and_chains(exc, expected):
    err = translate_error(exc, "cuda:0")
    assert type(err) is expected
    assert err.__cause__ is exc
    assert "[cuda:0]" in str(err)


def test_translate_with_numba_cuda_api_error():
    if cuda_is_simulated():  # its CudaAPIError is a RuntimeError without .code
        pytest.skip("the simulator's CudaAPIError is not the driver's")
    driver = pytest.importorskip("numba.cuda.cudadrv.driver")
    err = translate_error(driver.CudaAPIError(700, "illegal address"))
    assert isinstance(err, ContextPoisoned)


@pytest.mark.parametrize(
    "exc", [ValueError("shape"), TypeError("dtype"), Unrecoverable("x"), KeyboardInterrupt()]
)
def test_translate_keeps_validation_errors_and_gpu_errors(exc):
    assert translate_error(exc) is exc


def test_every_exported_gpu_error_is_one_device_work_can_raise():
    # a kind that nothing raises is a promise no caller can rely on (GpuRefStale was one)
    exported = {
        cls
        for name in accel_errors.__all__
        if (cls := getattr(accel_errors, name)) is not GpuError and issubclass(cls, GpuError)
    }
    assert exported == {expected for _, expected in TRANSLATIONS}
