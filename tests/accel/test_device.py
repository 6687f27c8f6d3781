"""Device names, discovery and logical CPU devices."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from atomr.accel import (
    Device,
    backend_for,
    cpu_devices,
    cuda_available,
    cuda_device_count,
    cuda_is_simulated,
    default_device,
    list_devices,
)


@pytest.mark.parametrize(
    "name,expected",
    [
        ("cpu", Device("cpu", 0)),
        ("cpu:3", Device("cpu", 3)),
        ("CUDA:1", Device("cuda", 1)),
        (" cuda ", Device("cuda", 0)),
    ],
)
def test_parse(name, expected):
    assert Device.parse(name) == expected
    assert Device.parse(expected) is expected


@pytest.mark.parametrize(
    "name", ["tpu:0", "cpu:", "cpu:x", "cuda:-1", "", "gpu", "cpu:\u00b2", "cuda:\u0663"]
)
def test_parse_rejects_unknown_names(name):
    with pytest.raises(ValueError, match="expected 'cpu', 'cpu:N', 'cuda' or 'cuda:N'"):
        Device.parse(name)


def test_constructor_checks():
    assert str(Device("cuda", 2)) == "cuda:2"
    with pytest.raises(ValueError, match="unknown device kind"):
        Device("tpu", 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=">= 0"):
        Device("cpu", -1)
    with pytest.raises(TypeError):
        Device.parse(3)  # type: ignore[arg-type]


def test_cpu_devices():
    assert [str(d) for d in cpu_devices(3)] == ["cpu:0", "cpu:1", "cpu:2"]
    with pytest.raises(ValueError, match="n >= 1"):
        cpu_devices(0)


def test_list_devices_matches_cuda_count():
    devices = list_devices()
    assert devices[-1] == Device("cpu", 0)
    assert [d for d in devices if d.is_cuda] == [
        Device("cuda", i) for i in range(cuda_device_count())
    ]
    assert default_device().is_cpu or not cuda_is_simulated()


def test_unknown_cuda_device_is_a_clear_error():
    with pytest.raises(ValueError, match="no such device cuda:7"):
        backend_for("cuda:7")


def test_discovery_without_cuda_never_crashes():
    """A fresh interpreter with no driver and no simulator: CPU only, no exception."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["NUMBA_CUDA_DRIVER"] = "/nonexistent/libcuda.so"
    code = (
        "from atomr.accel import list_devices, cuda_available, backend_for\n"
        "print(cuda_available(), [str(d) for d in list_devices()])\n"
        "try:\n    backend_for('cuda:0')\nexcept ValueError as e:\n    print('ValueError')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split("\n")[:2] == ["False ['cpu:0']", "ValueError"]


@pytest.mark.cuda
def test_simulator_has_one_device():
    if not cuda_available():
        pytest.skip("numba.cuda is not available")
    if not cuda_is_simulated():
        pytest.skip("real GPU: device count is the hardware's")
    assert [str(d) for d in list_devices()] == ["cuda:0", "cpu:0"]
    assert default_device() == Device("cpu", 0)
