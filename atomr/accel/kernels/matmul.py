"""Matrix multiply: ``out (+)= op(a) @ op(b)``, op = identity or transpose.

The transposed forms are what backward needs: ``dW = x.T @ dy``
(trans_a) and ``dx = dy @ W.T`` (trans_b). The scalar math is the dot
product of a row of op(a) with a column of op(b); on CUDA it is tiled
through shared memory (TILE x TILE tiles, one thread per output element),
on the CPU it is BLAS (``np.matmul`` with ``out=``, transposes passed as
views so no copy is made).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import float32

from atomr.accel.kernels._compile import TILE, cuda, gpu_kernel, launch_2d

__all__ = ["matmul_cpu", "matmul_cuda"]

# ---------------------------------------------------------------- CUDA


@gpu_kernel
def _matmul_kernel(a, b, out, trans_a, trans_b, accumulate):
    sa = cuda.shared.array((TILE, TILE), float32)
    sb = cuda.shared.array((TILE, TILE), float32)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    col = cuda.blockIdx.x * TILE + tx
    m = out.shape[0]
    n = out.shape[1]
    k = a.shape[0] if trans_a else a.shape[1]
    # row blocks blockIdx.y, + gridDim.y, ...: the condition is the block's,
    # so every thread of a block takes the same turns (syncthreads is safe)
    row_block = cuda.blockIdx.y
    while row_block * TILE < m:
        row = row_block * TILE + ty
        acc = float32(0.0)
        for t in range((k + TILE - 1) // TILE):
            ka = t * TILE + tx
            if row < m and ka < k:
                sa[ty, tx] = a[ka, row] if trans_a else a[row, ka]
            else:
                sa[ty, tx] = 0.0
            kb = t * TILE + ty
            if col < n and kb < k:
                sb[ty, tx] = b[col, kb] if trans_b else b[kb, col]
            else:
                sb[ty, tx] = 0.0
            cuda.syncthreads()
            for j in range(TILE):
                acc += sa[ty, j] * sb[j, tx]
            cuda.syncthreads()
        if row < m and col < n:
            if accumulate:
                out[row, col] += acc
            else:
                out[row, col] = acc
        row_block += cuda.gridDim.y


def matmul_cuda(
    a: Any,
    b: Any,
    out: Any,
    trans_a: bool = False,
    trans_b: bool = False,
    accumulate: bool = False,
) -> None:
    """out (+)= op(a) @ op(b) on float32 2-D device arrays (shapes already checked)."""
    launch_2d(
        _matmul_kernel,
        out.shape[0],
        out.shape[1],
        a,
        b,
        out,
        bool(trans_a),
        bool(trans_b),
        bool(accumulate),
    )


# ---------------------------------------------------------------- CPU twin


def matmul_cpu(
    a: np.ndarray,
    b: np.ndarray,
    out: np.ndarray,
    trans_a: bool = False,
    trans_b: bool = False,
    accumulate: bool = False,
) -> None:
    """out (+)= op(a) @ op(b) with BLAS (np.matmul releases the GIL); shapes already checked."""
    opa = a.T if trans_a else a
    opb = b.T if trans_b else b
    if accumulate:
        out += np.matmul(opa, opb)
    else:
        np.matmul(opa, opb, out=out)
