"""Fused optimizer updates over one flat parameter buffer: SGD, Adam, AdamW.

The rules are torch.optim's (published formulas), one pass per step:

SGD (momentum mu, dampening tau, weight decay wd, nesterov)::

    d = g + wd * p
    buf = d                                   on the first step (torch's rule)
    buf = mu * buf + (1 - tau) * d            afterwards
    d = d + mu * buf if nesterov else buf     (when mu != 0)
    p = p - lr * d

Adam (coupled L2) / AdamW (decoupled weight decay), step t >= 1::

    Adam:  g = g + wd * p          AdamW: p = p * (1 - lr * wd)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g^2
    step_size = lr / (1 - b1^t)
    denom = sqrt(v) / sqrt(1 - b2^t) + eps    (times the host reciprocal)
    p = p - step_size * m / denom

The per-element math (``sgd_update``, ``adam_update``) is written once and
compiled for both targets; the hyperparameters arrive validated, as an
``SgdHyperparameters`` / ``AdamHyperparameters`` (``atomr.accel.hyperparameters``),
whose ``kernel_args`` gives the kernel's scalars (Adam's bias corrections
computed once per step on the host). Gradients are read, never written.

Every step reports, from the same pass, whether all the new weights are
finite (``x - x != 0`` is true exactly for NaN and +-Inf): the caller refuses a
non-finite update without a second pass over the weights.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from atomr.accel.kernels._compile import (
    cpu_loop,
    cpu_scalar,
    cuda,
    gpu_kernel,
    gpu_scalar,
    launch_1d,
)

if TYPE_CHECKING:
    from atomr.accel.hyperparameters import AdamHyperparameters, SgdHyperparameters

__all__ = [
    "adam_step_cpu",
    "adam_step_cuda",
    "sgd_step_cpu",
    "sgd_step_cuda",
]

# ---------------------------------------------------------------- scalar math


def sgd_update(
    p: float,
    g: float,
    buf: float,
    lr: float,
    momentum: float,
    one_minus_dampening: float,
    weight_decay: float,
    nesterov: bool,
    first: bool,
) -> tuple[float, float]:
    """One SGD element: returns (new p, new momentum buffer).

    The host passes the scalars in the buffers' dtype (``1 - dampening``
    computed there), so float32 buffers are updated in float32 math.
    """
    d = g + weight_decay * p if weight_decay != 0.0 else g
    b = buf
    if momentum != 0.0:
        b = d if first else momentum * buf + one_minus_dampening * d
        d = d + momentum * b if nesterov else b
    return p - lr * d, b


def adam_update(
    p: float,
    g: float,
    m: float,
    v: float,
    beta1: float,
    one_minus_beta1: float,
    beta2: float,
    one_minus_beta2: float,
    l2: float,
    decay: float,
    step_size: float,
    inv_bc2_sqrt: float,
    eps: float,
) -> tuple[float, float, float]:
    """One Adam / AdamW element: returns (new p, new m, new v).

    The host passes ``l2 = weight_decay, decay = 1`` for Adam and ``l2 = 0,
    decay = 1 - lr * weight_decay`` for AdamW (both exact no-ops when unused),
    all in the buffers' dtype, so float32 buffers are updated in float32 math
    (as torch does) and the CPU loop vectorises. ``sqrt(v) / sqrt(1 - b2^t)``
    is computed as ``sqrt(v) * inv_bc2_sqrt`` (host reciprocal): one division
    per element instead of two, within float32 rounding of torch's formula.
    """
    p = p * decay
    g = g + l2 * p
    m = beta1 * m + one_minus_beta1 * g
    v = beta2 * v + one_minus_beta2 * g * g
    denom = math.sqrt(v) * inv_bc2_sqrt + eps
    return p - step_size * m / denom, m, v


_sgd_cpu = cpu_scalar(sgd_update)
_sgd_gpu = gpu_scalar(sgd_update)
_adam_cpu = cpu_scalar(adam_update)
_adam_gpu = gpu_scalar(adam_update)

# ---------------------------------------------------------------- CUDA


@gpu_kernel
def _sgd_kernel(
    p,
    g,
    buf,
    p_out,
    buf_out,
    nonfinite,
    lr,
    momentum,
    one_minus_dampening,
    weight_decay,
    nesterov,
    first,
):
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    has_buf = momentum != 0.0
    while i < p.size:
        b = buf[i] if has_buf else g[i]  # unused; keeps b in the buffers' dtype
        np_, nb = _sgd_gpu(
            p[i], g[i], b, lr, momentum, one_minus_dampening, weight_decay, nesterov, first
        )
        p_out[i] = np_
        if has_buf:
            buf_out[i] = nb
        q = p_out[i]  # as stored: a float64 result may overflow only in the cast
        if q - q != 0.0:  # inf - inf and NaN - NaN are NaN; a racy store of 1 is benign
            nonfinite[0] = 1
        i += stride


@gpu_kernel
def _adam_kernel(
    p,
    g,
    m,
    v,
    p_out,
    m_out,
    v_out,
    nonfinite,
    b1,
    omb1,
    b2,
    omb2,
    l2,
    decay,
    step_size,
    inv_bc2,
    eps,
):
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < p.size:
        np_, nm, nv = _adam_gpu(
            p[i],
            g[i],
            m[i],
            v[i],
            b1,
            omb1,
            b2,
            omb2,
            l2,
            decay,
            step_size,
            inv_bc2,
            eps,
        )
        p_out[i] = np_
        m_out[i] = nm
        v_out[i] = nv
        q = p_out[i]
        if q - q != 0.0:
            nonfinite[0] = 1
        i += stride


def sgd_step_cuda(
    p: Any,
    g: Any,
    buf: Any,
    hyper: SgdHyperparameters,
    step: int,
    p_out: Any = None,
    buf_out: Any = None,
) -> bool:
    """Fused SGD on flat device arrays (buf unused, may be any array, when momentum == 0).

    The results go to ``p_out`` / ``buf_out`` (default: ``p`` / ``buf``, in place).
    Returns True when every new weight is finite (checked in the same pass).
    """
    outs = (p if p_out is None else p_out, buf if buf_out is None else buf_out)
    nonfinite = _flag()
    launch_1d(_sgd_kernel, p.size, p, g, buf, *outs, nonfinite, *hyper.kernel_args(step, p.dtype))
    return _all_finite(nonfinite)


def adam_step_cuda(
    p: Any,
    g: Any,
    m: Any,
    v: Any,
    hyper: AdamHyperparameters,
    step: int,
    p_out: Any = None,
    m_out: Any = None,
    v_out: Any = None,
) -> bool:
    """Fused Adam / AdamW on flat device arrays, step t >= 1.

    The results go to ``p_out`` / ``m_out`` / ``v_out`` (default: in place).
    Returns True when every new weight is finite (checked in the same pass).
    """
    coeffs = hyper.kernel_args(step, p.dtype)
    outs = (p if p_out is None else p_out, m if m_out is None else m_out)
    v_new = v if v_out is None else v_out
    nonfinite = _flag()
    launch_1d(_adam_kernel, p.size, p, g, m, v, *outs, v_new, nonfinite, *coeffs)
    return _all_finite(nonfinite)


def _flag() -> Any:
    """A zeroed one-element device flag the kernels set to 1 on a non-finite weight."""
    return cuda.to_device(np.zeros(1, dtype=np.int32))


def _all_finite(nonfinite: Any) -> bool:
    """Read the flag back (this waits for the kernel): True when no weight was non-finite."""
    return bool(nonfinite.copy_to_host()[0] == 0)


# ---------------------------------------------------------------- CPU twins
# Two loops per rule over the same scalar math: in place, and out of place
# (``*_out`` arrays). One loop for both would let LLVM vectorise only behind a
# runtime overlap check, which in-place calls always fail.


@cpu_loop
def _sgd_loop(p, g, buf, lr, momentum, one_minus_dampening, weight_decay, nesterov, first):
    has_buf = momentum != 0.0
    bad = False
    for i in range(p.size):
        b = buf[i] if has_buf else g[i]  # unused; keeps b in the buffers' dtype
        np_, nb = _sgd_cpu(
            p[i], g[i], b, lr, momentum, one_minus_dampening, weight_decay, nesterov, first
        )
        p[i] = np_
        if has_buf:
            buf[i] = nb
        q = p[i]  # as stored: a float64 result may overflow only in the cast
        bad |= q - q != 0.0
    return not bad


@cpu_loop
def _sgd_loop_out(
    p, g, buf, p_out, buf_out, lr, momentum, one_minus_dampening, weight_decay, nesterov, first
):
    has_buf = momentum != 0.0
    bad = False
    for i in range(p.size):
        b = buf[i] if has_buf else g[i]  # unused; keeps b in the buffers' dtype
        np_, nb = _sgd_cpu(
            p[i], g[i], b, lr, momentum, one_minus_dampening, weight_decay, nesterov, first
        )
        p_out[i] = np_
        if has_buf:
            buf_out[i] = nb
        q = p_out[i]
        bad |= q - q != 0.0
    return not bad


@cpu_loop
def _adam_loop(p, g, m, v, b1, omb1, b2, omb2, l2, decay, step_size, inv_bc2, eps):
    bad = False
    for i in range(p.size):
        np_, nm, nv = _adam_cpu(
            p[i], g[i], m[i], v[i], b1, omb1, b2, omb2, l2, decay, step_size, inv_bc2, eps
        )
        p[i] = np_
        m[i] = nm
        v[i] = nv
        q = p[i]
        bad |= q - q != 0.0
    return not bad


@cpu_loop
def _adam_loop_out(
    p, g, m, v, p_out, m_out, v_out, b1, omb1, b2, omb2, l2, decay, step_size, inv_bc2, eps
):
    bad = False
    for i in range(p.size):
        np_, nm, nv = _adam_cpu(
            p[i], g[i], m[i], v[i], b1, omb1, b2, omb2, l2, decay, step_size, inv_bc2, eps
        )
        p_out[i] = np_
        m_out[i] = nm
        v_out[i] = nv
        q = p_out[i]
        bad |= q - q != 0.0
    return not bad


def sgd_step_cpu(
    p: Any,
    g: Any,
    buf: Any,
    hyper: SgdHyperparameters,
    step: int,
    p_out: Any = None,
    buf_out: Any = None,
) -> bool:
    """Fused SGD on flat arrays (buf unused, may be any array, when momentum == 0).

    The results go to ``p_out`` / ``buf_out`` (default: ``p`` / ``buf``, in place).
    Returns True when every new weight is finite (checked in the same pass).
    """
    args = hyper.kernel_args(step, p.dtype)
    if (p_out is None or p_out is p) and (buf_out is None or buf_out is buf):
        return bool(_sgd_loop(p, g, buf, *args))
    outs = (p if p_out is None else p_out, buf if buf_out is None else buf_out)
    return bool(_sgd_loop_out(p, g, buf, *outs, *args))


def adam_step_cpu(
    p: Any,
    g: Any,
    m: Any,
    v: Any,
    hyper: AdamHyperparameters,
    step: int,
    p_out: Any = None,
    m_out: Any = None,
    v_out: Any = None,
) -> bool:
    """Fused Adam / AdamW on flat arrays, step t >= 1.

    The results go to ``p_out`` / ``m_out`` / ``v_out`` (default: in place).
    Returns True when every new weight is finite (checked in the same pass).
    """
    coeffs = hyper.kernel_args(step, p.dtype)
    if (
        (p_out is None or p_out is p)
        and (m_out is None or m_out is m)
        and (v_out is None or v_out is v)
    ):
        return bool(_adam_loop(p, g, m, v, *coeffs))
    outs = (m if m_out is None else m_out, v if v_out is None else v_out)
    return bool(_adam_loop_out(p, g, m, v, p if p_out is None else p_out, *outs, *coeffs))
