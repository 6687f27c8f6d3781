"""Gradient clipping by global L2 norm (torch's `clip_grad_norm_`)."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["clip_coefficient", "clip_grad_norm", "global_norm"]


def global_norm(backend: Any, grads: Any) -> float:
    """The L2 norm of a flat gradient vector on its device.

    Args:
        backend: the device's kernels.
        grads: flat gradient buffer.

    Returns:
        `sqrt(sum(grads^2))` (inf or NaN when a gradient is not finite).
    """
    return math.sqrt(float(backend.squared_norm(grads)))


def clip_coefficient(norm: float, max_norm: float | None) -> float:
    """The factor that clips a gradient of global norm `norm` to `max_norm`.

    As torch.nn.utils.clip_grad_norm_: `max_norm / (norm + 1e-6)` when that
    is below 1, else 1 (also for `max_norm=None`, no clipping). Trainers whose
    gradient is spread over several workers compute it once from the global
    norm and send it to every worker.

    Args:
        norm: the gradient's global L2 norm.
        max_norm: the largest allowed norm (> 0), or None.

    Returns:
        The factor, in (0, 1].
    """
    if max_norm is None:
        return 1.0
    return min(1.0, max_norm / (norm + 1e-6))


def clip_grad_norm(backend: Any, grads: Any, max_norm: float, norm: float | None = None) -> float:
    """Scale `grads` in place so that their global norm is at most `max_norm`.

    As torch.nn.utils.clip_grad_norm_: with `total = ||grads||`, the factor
    is `max_norm / (total + 1e-6)`, applied only when it is below 1.

    Args:
        backend: the device's kernels.
        grads: flat gradient buffer (scaled in place).
        max_norm: the largest allowed norm (> 0).
        norm: the already-computed norm of `grads`, to save a pass.

    Returns:
        The norm before clipping.

    Raises:
        ValueError: `max_norm` is not positive.
    """
    if not max_norm > 0.0:
        raise ValueError(f"max_norm must be > 0, got {max_norm}")
    total = global_norm(backend, grads) if norm is None else float(norm)
    coef = clip_coefficient(total, max_norm)
    if coef < 1.0:
        backend.scale(grads, coef)
    return total
