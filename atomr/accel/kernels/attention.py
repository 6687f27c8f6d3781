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

The forward and the query-side backward are row functions over `(b, h, i)`,
the key-side backward one over `(b, h, j)`; each is written once and
compiled as the CPU twin's loop body and as a CUDA thread's work. Sums
accumulate in float64.
"""

from __future__ import annotations

import math
from typing import Any

from atomr.accel.kernels._compile import (
    cpu_loop,
    cpu_scalar,
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
            s += qkv[qi, h * dh + e] * qkv[kj, d + h * dh + e]
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
            acc += p[bh, i, j] * qkv[b * t_len + j, 2 * d + h * dh + e]
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
            dp += dout[qi, h * dh + e] * qkv[b * t_len + j, 2 * d + h * dh + e]
        ds[bh, i, j] = dp
        dot += p[bh, i, j] * dp
    for j in range(i + 1):
        ds[bh, i, j] = p[bh, i, j] * (ds[bh, i, j] - dot)
    for e in range(dh):
        acc = 0.0
        for j in range(i + 1):
            acc += ds[bh, i, j] * qkv[b * t_len + j, d + h * dh + e]
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
            dk += ds[bh, i, j] * qkv[qi, h * dh + e]
            dv += p[bh, i, j] * dout[qi, h * dh + e]
        dqkv[kj, d + h * dh + e] = dk * scale
        dqkv[kj, 2 * d + h * dh + e] = dv


_forward_cpu = cpu_scalar(_forward_row)
_query_cpu = cpu_scalar(_query_row)
_key_cpu = cpu_scalar(_key_row)
_forward_gpu = gpu_scalar(_forward_row)
_query_gpu = gpu_scalar(_query_row)
_key_gpu = gpu_scalar(_key_row)


@cpu_loop
def attention_forward_cpu(qkv, p, o, heads, scale):
    """o = causal attention of `qkv`; `P` (the weights) kept for the backward."""
    for idx in range(p.shape[0] * p.shape[1]):
        _forward_cpu(qkv, p, o, heads, scale, idx)


@cpu_loop
def attention_backward_cpu(qkv, p, dout, ds, dqkv, heads, scale):
    """dqkv (overwritten) from `do`; `ds` is scratch shaped like `P`."""
    n = p.shape[0] * p.shape[1]
    for idx in range(n):
        _query_cpu(qkv, p, dout, ds, dqkv, heads, scale, idx)
    for idx in range(n):
        _key_cpu(qkv, p, dout, ds, dqkv, heads, scale, idx)


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
