"""Token and position embedding: forward gather, backward sums.

`ids` is `(B*T,)` (row `b*T + t`), `tokens` the `(V, D)` table, `positions`
the `(T_max, D)` table; `y[r] = tokens[ids[r]] + positions[r % T]`. The
backward sums are written per *table row* (a thread per vocabulary entry,
one per position), so no two threads add into the same row: no atomics.
Sums accumulate in float64 (each float32 term cast with ``float64(...)``,
as compiled code does anyway, so that the CUDA simulator, where NumPy 2 keeps
a float32 scalar plus a Python float in float32, adds as a GPU does).
"""

from __future__ import annotations

from typing import Any

from numba import float64

from atomr.accel.kernels._compile import (
    cpu_loop,
    cpu_scalar,
    cuda,
    gpu_kernel,
    gpu_scalar,
    launch_1d,
)

__all__ = [
    "embedding_backward_cpu",
    "embedding_backward_cuda",
    "embedding_forward_cpu",
    "embedding_forward_cuda",
]


def _forward_row(ids, tokens, positions, y, t_len, r):
    v = ids[r]
    t = r % t_len
    for j in range(y.shape[1]):
        y[r, j] = tokens[v, j] + positions[t, j]


def _token_row(ids, dy, dtokens, accumulate, v):
    for j in range(dy.shape[1]):
        acc = 0.0
        for r in range(ids.shape[0]):
            if ids[r] == v:
                acc += float64(dy[r, j])
        if accumulate:
            dtokens[v, j] += acc
        else:
            dtokens[v, j] = acc


def _position_row(dy, dpositions, t_len, accumulate, t):
    rows = dy.shape[0] // t_len
    for j in range(dy.shape[1]):
        acc = 0.0
        if t < t_len:
            for b in range(rows):
                acc += float64(dy[b * t_len + t, j])
        if accumulate:
            dpositions[t, j] += acc
        else:
            dpositions[t, j] = acc


_forward_cpu = cpu_scalar(_forward_row)
_token_cpu = cpu_scalar(_token_row)
_position_cpu = cpu_scalar(_position_row)
_forward_gpu = gpu_scalar(_forward_row)
_token_gpu = gpu_scalar(_token_row)
_position_gpu = gpu_scalar(_position_row)


@cpu_loop
def embedding_forward_cpu(ids, tokens, positions, y, t_len):
    """y = tokens[ids] + positions[row % t_len]."""
    for r in range(ids.shape[0]):
        _forward_cpu(ids, tokens, positions, y, t_len, r)


@cpu_loop
def embedding_backward_cpu(ids, dy, dtokens, dpositions, t_len, accumulate):
    """The tables' gradients (written, or added with `accumulate`); positions
    past `t_len` get 0 (or nothing added)."""
    for v in range(dtokens.shape[0]):
        _token_cpu(ids, dy, dtokens, accumulate, v)
    for t in range(dpositions.shape[0]):
        _position_cpu(dy, dpositions, t_len, accumulate, t)


@gpu_kernel
def _forward_kernel(ids, tokens, positions, y, t_len):
    r = cuda.grid(1)
    while r < ids.shape[0]:
        _forward_gpu(ids, tokens, positions, y, t_len, r)
        r += cuda.gridsize(1)


@gpu_kernel
def _token_kernel(ids, dy, dtokens, accumulate):
    v = cuda.grid(1)
    while v < dtokens.shape[0]:
        _token_gpu(ids, dy, dtokens, accumulate, v)
        v += cuda.gridsize(1)


@gpu_kernel
def _position_kernel(dy, dpositions, t_len, accumulate):
    t = cuda.grid(1)
    while t < dpositions.shape[0]:
        _position_gpu(dy, dpositions, t_len, accumulate, t)
        t += cuda.gridsize(1)


def embedding_forward_cuda(ids: Any, tokens: Any, positions: Any, y: Any, t_len: int) -> None:
    """The CUDA twin of `embedding_forward_cpu` (a thread per row)."""
    launch_1d(_forward_kernel, ids.shape[0], ids, tokens, positions, y, t_len)


def embedding_backward_cuda(
    ids: Any, dy: Any, dtokens: Any, dpositions: Any, t_len: int, accumulate: bool
) -> None:
    """The CUDA twin of `embedding_backward_cpu` (a thread per table row)."""
    launch_1d(_token_kernel, dtokens.shape[0], ids, dy, dtokens, accumulate)
    launch_1d(_position_kernel, dpositions.shape[0], dy, dpositions, t_len, accumulate)
