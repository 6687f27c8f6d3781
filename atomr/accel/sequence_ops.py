"""The kernels of sequence models (LayerNorm, causal attention, embeddings,
dropout) for a backend: the CPU twin on a `CpuBackend`, the CUDA kernel
otherwise. Callers own their buffers (contiguous, the model's dtype, on the
backend's device) and pass them unchecked, as to `Backend`'s `*_unchecked`
entries; the layers of `atomr.train.core.model` are those callers.
"""

from __future__ import annotations

from typing import Any

from atomr.accel.cpu_backend import CpuBackend
from atomr.accel.kernels import attention, dropout, embedding, layernorm

__all__ = [
    "attention_backward",
    "attention_forward",
    "dropout_apply",
    "embedding_backward",
    "embedding_forward",
    "layernorm_backward",
    "layernorm_forward",
]


def _on_cpu(be: Any) -> bool:
    return isinstance(be, CpuBackend)


def layernorm_forward(
    be: Any, x: Any, gamma: Any, beta: Any, y: Any, mean: Any, rstd: Any, eps: float
) -> None:
    """`y = LayerNorm(x)` over the last axis of the 2-D `x`, keeping `mean` and `rstd` (rows;
    float64 buffers keep them as computed, for a backward that sees the forward's xhat)."""
    run = layernorm.layernorm_forward_cpu if _on_cpu(be) else layernorm.layernorm_forward_cuda
    run(x, gamma, beta, y, mean, rstd, eps)


def layernorm_backward(
    be: Any,
    x: Any,
    gamma: Any,
    mean: Any,
    rstd: Any,
    dy: Any,
    dx: Any | None,
    dgamma: Any,
    dbeta: Any,
    accumulate: bool,
) -> None:
    """LayerNorm's parameter gradients (written or added) and, unless `dx` is
    None, its input gradient (written)."""
    if _on_cpu(be):
        layernorm.layernorm_params_grad_cpu(x, mean, rstd, dy, dgamma, dbeta, accumulate)
        if dx is not None:
            layernorm.layernorm_backward_cpu(x, gamma, mean, rstd, dy, dx)
        return
    layernorm.layernorm_params_grad_cuda(x, mean, rstd, dy, dgamma, dbeta, accumulate)
    if dx is not None:
        layernorm.layernorm_backward_cuda(x, gamma, mean, rstd, dy, dx)


def attention_forward(be: Any, qkv: Any, p: Any, o: Any, heads: int, scale: float) -> None:
    """Causal multi-head attention (`kernels/attention.py` for the layout)."""
    run = attention.attention_forward_cpu if _on_cpu(be) else attention.attention_forward_cuda
    run(qkv, p, o, heads, scale)


def attention_backward(
    be: Any, qkv: Any, p: Any, dout: Any, ds: Any, dqkv: Any, heads: int, scale: float
) -> None:
    """The input gradient `dqkv` (written) of causal attention; `ds` is scratch like `p`."""
    run = attention.attention_backward_cpu if _on_cpu(be) else attention.attention_backward_cuda
    run(qkv, p, dout, ds, dqkv, heads, scale)


def embedding_forward(be: Any, ids: Any, tokens: Any, positions: Any, y: Any, t_len: int) -> None:
    """`y[r] = tokens[ids[r]] + positions[r % t_len]`."""
    run = embedding.embedding_forward_cpu if _on_cpu(be) else embedding.embedding_forward_cuda
    run(ids, tokens, positions, y, t_len)


def embedding_backward(
    be: Any, ids: Any, dy: Any, dtokens: Any, dpositions: Any, t_len: int, accumulate: bool
) -> None:
    """The token and position tables' gradients (written or added)."""
    run = embedding.embedding_backward_cpu if _on_cpu(be) else embedding.embedding_backward_cuda
    run(ids, dy, dtokens, dpositions, t_len, accumulate)


def dropout_apply(
    be: Any,
    x: Any,
    y: Any,
    per_sample: int,
    sample_offset: int,
    step: int,
    seed: int,
    p: float,
) -> None:
    """`y = x * mask / (1 - p)` on flat arrays (`kernels/dropout.py` for the mask)."""
    run = dropout.dropout_cpu if _on_cpu(be) else dropout.dropout_cuda
    run(x, y, per_sample, sample_offset, step, seed, p, 1.0 / (1.0 - p))
