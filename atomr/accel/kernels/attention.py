"""Causal multi-head self-attention, fused: scores, mask, softmax and the
weighted sum of the values in one pass per query row.

Layout: `qkv` is `(B*T, 3*D)` (row `b*T + t`; columns `[q | k | v]`, head
`h` at `h*dh : (h+1)*dh` of each, `D = H*dh`), the output `o` is `(B*T, D)`
and the attention weights `P` are `(B*H, T, T)` (kept for the backward pass;
zero above the diagonal). One work item is one query row `(b, h, i)`.

    S_ij = scale * q_i . k_j (j <= i)     P_i = softmax(S_i)        o_i = sum_j P_ij v_j
    dP_ij = do_i . v_j      dS_ij = P_ij (dP_ij - sum_j P_ij dP_ij)
    dq_i = scale * sum_j dS_ij k_j        (per query row i)
    dk_j = scale * sum_i dS_ij q_i        dv_j = sum_i P_ij do_i    (per key row j: no atomics)

On CUDA the forward and the query-side backward are row functions over
`(b, h, i)`, the key-side backward one over `(b, h, j)` (a thread each; sums
in float64, each float32 product cast with ``float64(...)`` as compiled code
does anyway, so that the CUDA simulator, where NumPy 2 keeps a float32 scalar
plus a Python float in float32, adds as a GPU does). The CPU twin is
batched BLAS over every (batch, head), as the CPU matmul is BLAS: the same
formulas, one `np.matmul` per product.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import float64

from atomr.accel.kernels._compile import (
    cuda,
    gpu_kernel,
    gpu_scalar,
    launch_1d,
)

__all__ = [
    "attention_backward_cpu",
    "attention_backward_cuda",
    "attention_forward_cpu",
    "attention_forward_cuda",
]


def _forward_row(qkv, p, o, heads, scale, idx):
    t_len = p.shape[1]
    d = o.shape[1]
    dh = d // heads
    bh = idx // t_len
    i = idx - bh * t_len
    b = bh // heads
    h = bh - b * heads
    qi = b * t_len + i
    top = 0.0
    for j in range(i + 1):
        kj = b * t_len + j
        s = 0.0
        for e in range(dh):
            s += float64(qkv[qi, h * dh + e] * qkv[kj, d + h * dh + e])
        s *= scale
        p[bh, i, j] = s
        if j == 0 or s > top:
            top = s
    total = 0.0
    for j in range(i + 1):
        w = math.exp(p[bh, i, j] - top)
        p[bh, i, j] = w
        total += w
    for j in range(i + 1):
        p[bh, i, j] = p[bh, i, j] / total
    for j in range(i + 1, t_len):
        p[bh, i, j] = 0.0
    for e in range(dh):
        acc = 0.0
        for j in range(i + 1):
            acc += float64(p[bh, i, j] * qkv[b * t_len + j, 2 * d + h * dh + e])
        o[qi, h * dh + e] = acc


def _query_row(qkv, p, dout, ds, dqkv, heads, scale, idx):
    t_len = p.shape[1]
    d = dout.shape[1]
    dh = d // heads
    bh = idx // t_len
    i = idx - bh * t_len
    b = bh // heads
    h = bh - b * heads
    qi = b * t_len + i
    dot = 0.0
    for j in range(i + 1):
        dp = 0.0
        for e in range(dh):
            dp += float64(dout[qi, h * dh + e] * qkv[b * t_len + j, 2 * d + h * dh + e])
        ds[bh, i, j] = dp
        dot += float64(p[bh, i, j]) * dp
    for j in range(i + 1):
        ds[bh, i, j] = p[bh, i, j] * (ds[bh, i, j] - dot)
    for e in range(dh):
        acc = 0.0
        for j in range(i + 1):
            acc += float64(ds[bh, i, j] * qkv[b * t_len + j, d + h * dh + e])
        dqkv[qi, h * dh + e] = acc * scale


def _key_row(qkv, p, dout, ds, dqkv, heads, scale, idx):
    t_len = p.shape[1]
    d = dout.shape[1]
    dh = d // heads
    bh = idx // t_len
    j = idx - bh * t_len
    b = bh // heads
    h = bh - b * heads
    kj = b * t_len + j
    for e in range(dh):
        dk = 0.0
        dv = 0.0
        for i in range(j, t_len):
            qi = b * t_len + i
            dk += float64(ds[bh, i, j] * qkv[qi, h * dh + e])
            dv += float64(p[bh, i, j] * dout[qi, h * dh + e])
        dqkv[kj, d + h * dh + e] = dk * scale
        dqkv[kj, 2 * d + h * dh + e] = dv


_forward_gpu = gpu_scalar(_forward_row)
_query_gpu = gpu_scalar(_query_row)
_key_gpu = gpu_scalar(_key_row)


def _heads(qkv: np.ndarray, part: int, heads: int, t_len: int) -> np.ndarray:
    """q (part 0), k (1) or v (2) of `qkv` as `(B*H, T, dh)`, contiguous."""
    d = qkv.shape[1] // 3
    block = qkv[:, part * d : (part + 1) * d].reshape(-1, t_len, heads, d // heads)
    return np.ascontiguousarray(block.transpose(0, 2, 1, 3)).reshape(-1, t_len, d // heads)


def _merge(x: np.ndarray, heads: int, out: np.ndarray) -> None:
    """`(B*H, T, dh)` back into the `(B*T, H*dh)` columns of `out`."""
    bh, t_len, dh = x.shape
    out[...] = x.reshape(bh // heads, heads, t_len, dh).transpose(0, 2, 1, 3).reshape(out.shape)


def attention_forward_cpu(qkv: Any, p: Any, o: Any, heads: int, scale: float) -> None:
    """o = causal attention of `qkv`; `P` (the weights) kept for the backward.

    The CPU twin is batched BLAS (`np.matmul` over every (batch, head)), as
    the CPU matmul is: the scores, the masked softmax, the weighted sum.
    """
    t_len = p.shape[1]
    q, k, v = (_heads(qkv, i, heads, t_len) for i in range(3))
    np.matmul(q, k.transpose(0, 2, 1), out=p)
    p *= p.dtype.type(scale)
    p[:, ~np.tril(np.ones((t_len, t_len), dtype=bool))] = -np.inf
    p -= p.max(axis=2, keepdims=True)
    np.exp(p, out=p)
    p /= p.sum(axis=2, keepdims=True)
    _merge(np.matmul(p, v), heads, o)


def attention_backward_cpu(
    qkv: Any, p: Any, dout: Any, ds: Any, dqkv: Any, heads: int, scale: float
) -> None:
    """dqkv (overwritten) from `do`; `ds` is scratch shaped like `P` (batched BLAS)."""
    t_len, d = p.shape[1], dout.shape[1]
    q, k, v = (_heads(qkv, i, heads, t_len) for i in range(3))
    do = np.ascontiguousarray(
        dout.reshape(-1, t_len, heads, d // heads).transpose(0, 2, 1, 3)
    ).reshape(-1, t_len, d // heads)
    np.matmul(do, v.transpose(0, 2, 1), out=ds)
    ds -= np.sum(p * ds, axis=2, keepdims=True)
    ds *= p
    ds *= ds.dtype.type(scale)
    _merge(np.matmul(ds, k), heads, dqkv[:, :d])
    _merge(np.matmul(ds.transpose(0, 2, 1), q), heads, dqkv[:, d : 2 * d])
    _merge(np.matmul(p.transpose(0, 2, 1), do), heads, dqkv[:, 2 * d :])


@gpu_kernel
def _forward_kernel(qkv, p, o, heads, scale):
    idx = cuda.grid(1)
    while idx < p.shape[0] * p.shape[1]:
        _forward_gpu(qkv, p, o, heads, scale, idx)
        idx += cuda.gridsize(1)


@gpu_kernel
def _query_kernel(qkv, p, dout, ds, dqkv, heads, scale):
    idx = cuda.grid(1)
    while idx < p.shape[0] * p.shape[1]:
        _query_gpu(qkv, p, dout, ds, dqkv, heads, scale, idx)
        idx += cuda.gridsize(1)


@gpu_kernel
def _key_kernel(qkv, p, dout, ds, dqkv, heads, scale):
    idx = cuda.grid(1)
    while idx < p.shape[0] * p.shape[1]:
        _key_gpu(qkv, p, dout, ds, dqkv, heads, scale, idx)
        idx += cuda.gridsize(1)


def attention_forward_cuda(qkv: Any, p: Any, o: Any, heads: int, scale: float) -> None:
    """The CUDA twin of `attention_forward_cpu` (a thread per query row)."""
    launch_1d(_forward_kernel, p.shape[0] * p.shape[1], qkv, p, o, heads, scale)


def attention_backward_cuda(
    qkv: Any, p: Any, dout: Any, ds: Any, dqkv: Any, heads: int, scale: float
) -> None:
    """The CUDA twin of `attention_backward_cpu`: the query rows, then the key rows."""
    n = p.shape[0] * p.shape[1]
    launch_1d(_query_kernel, n, qkv, p, dout, ds, dqkv, heads, scale)
    launch_1d(_key_kernel, n, qkv, p, dout, ds, dqkv, heads, scale)
