"""How kernels are launched (atomr/accel/kernels/_compile.py): grids CUDA accepts."""

from __future__ import annotations

from typing import Any

import numpy as np
from accel_helpers import get, put, rand

from atomr.accel.kernels._compile import MAX_GRID_Y, TILE, launch_2d

CUDA_GRID_Y_LIMIT = 65535


class _Recorder:
    """Stands in for a kernel: records the grid it is launched with."""

    def __init__(self) -> None:
        self.grids: list[Any] = []

    def __getitem__(self, config: Any) -> Any:
        self.grids.append(config[0])
        return lambda *args: None


def test_launch_2d_keeps_the_row_blocks_within_cudas_limit():
    # 2M rows in 16-row blocks asked for a grid 125000 blocks tall, which
    # CUDA refuses (bias_add or matmul over a large evaluation batch)
    kernel = _Recorder()
    launch_2d(kernel, 2_000_000, 10)
    ((cols, rows),) = kernel.grids
    assert rows <= min(MAX_GRID_Y, CUDA_GRID_Y_LIMIT)
    assert cols == (10 + TILE - 1) // TILE


def test_2d_kernels_cover_rows_beyond_one_grid(cuda_be):
    # more row blocks than the grid holds: the kernels loop over them
    rng = np.random.default_rng(7)
    m = MAX_GRID_Y * TILE * 2 + 3
    x, bias = rand(rng, m, 3), rand(rng, 3)
    xb = put(cuda_be, x)
    cuda_be.bias_add(xb, put(cuda_be, bias))
    np.testing.assert_allclose(get(cuda_be, xb), x + bias, rtol=1e-6)
    a, b = rand(rng, m, 5), rand(rng, 5, 2)
    out = put(cuda_be, np.full((m, 2), np.nan, np.float32))
    cuda_be.matmul(put(cuda_be, a), put(cuda_be, b), out)
    np.testing.assert_allclose(get(cuda_be, out), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-5)
    out_t = put(cuda_be, np.full((m, 2), np.nan, np.float32))
    cuda_be.matmul(put(cuda_be, np.ascontiguousarray(a.T)), put(cuda_be, b), out_t, trans_a=True)
    np.testing.assert_allclose(get(cuda_be, out_t), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-5)
