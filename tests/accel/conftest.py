"""Shared fixtures of the accel tests: one suite, parametrized over the available backends.

``be`` is the CpuBackend, and the CudaBackend (marked ``cuda``) when numba.cuda
is available (a GPU, or NUMBA_ENABLE_CUDASIM=1); otherwise the CUDA case is
skipped with the reason. CUDA cases use tiny shapes (the simulator runs one
Python thread per CUDA thread).
"""

from __future__ import annotations

import numpy as np
import pytest

from atomr.accel import Backend, backend_for, cuda_available

BACKENDS = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", id="cuda", marks=pytest.mark.cuda),
]

NO_CUDA = "numba.cuda is not available (no GPU; set NUMBA_ENABLE_CUDASIM=1 for the simulator)"


@pytest.fixture(params=BACKENDS)
def be(request: pytest.FixtureRequest) -> Backend:
    """The backend under test."""
    if request.param == "cuda":
        if not cuda_available():
            pytest.skip(NO_CUDA)
        return backend_for("cuda:0")
    return backend_for("cpu:0")


@pytest.fixture
def cuda_be() -> Backend:
    """The CUDA backend, or a skip."""
    if not cuda_available():
        pytest.skip(NO_CUDA)
    return backend_for("cuda:0")


@pytest.fixture
def rng() -> np.random.Generator:
    """A seeded generator."""
    return np.random.default_rng(1234)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that asks for ``cuda_be`` is a CUDA test: mark it ``cuda`` so the
    simulator lane (``pytest -m cuda``) runs it."""
    for item in items:
        if "cuda_be" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cuda)
