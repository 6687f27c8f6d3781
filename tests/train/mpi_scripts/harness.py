"""Launch a script of this folder under `mpiexec` for the MPI tests."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def require_mpi() -> None:
    """Skip the calling test when mpi4py or mpiexec is missing."""
    pytest.importorskip("mpi4py")
    from atomr.train.comm.mpi.launch import find_mpiexec

    try:
        find_mpiexec()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))


def run_script(
    n: int, script: str, *args: object, timeout: float = 90.0
) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run `script` (a file of this folder) on `n` ranks; returns the
    completed process (output captured) and the wall time in seconds."""
    require_mpi()
    from atomr.train.comm.mpi.launch import run_mpiexec

    start = time.monotonic()
    program = [sys.executable, str(HERE / script), *(str(a) for a in args)]
    result = run_mpiexec(n, program, timeout=timeout, capture=True)
    return result, time.monotonic() - start
