"""`gradient_check`: a layer's backward against float64 central differences.

For a layer of your own: `assert gradient_check(MyLayer(...), (T, d)) < 1e-6`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from atomr.train.core._cpu import cpu_backend
from atomr.train.core.model.layer import ForwardContext, Layer

__all__ = ["gradient_check"]


def _loss(
    layer: Layer, params: list[np.ndarray], x: np.ndarray, r: np.ndarray, ctx: ForwardContext
) -> float:
    y, _ = layer.forward(cpu_backend(), params, x, ctx)
    return float(np.sum(np.asarray(y) * r))


def _numeric(
    layer: Layer,
    params: list[np.ndarray],
    x: np.ndarray,
    r: np.ndarray,
    target: np.ndarray,
    eps: float,
    ctx: ForwardContext,
) -> np.ndarray:
    """Central differences of `sum(y * r)` with respect to every entry of `target`."""
    grad = np.zeros_like(target)
    flat, out = target.reshape(-1), grad.reshape(-1)
    for i in range(flat.size):
        keep = flat[i]
        flat[i] = keep + eps
        up = _loss(layer, params, x, r, ctx)
        flat[i] = keep - eps
        down = _loss(layer, params, x, r, ctx)
        flat[i] = keep
        out[i] = (up - down) / (2 * eps)
    return grad


def gradient_check(
    layer: Layer,
    in_shape: Sequence[int],
    *,
    batch: int = 2,
    seed: int = 0,
    eps: float = 1e-6,
    tokens: int | None = None,
    ctx: ForwardContext | None = None,
) -> float:
    """The largest error of `layer.backward` against central differences.

    Runs in float64 on the CPU: random parameters (the layer's own
    initialisation, then perturbed so that no gradient is trivially 0), a
    random input, the loss `sum(y * r)` for a random `r`.

    Args:
        layer: the layer.
        in_shape: its per-sample input shape.
        batch: rows of the input.
        seed: the seed of the random values.
        eps: the difference step.
        tokens: for a layer taking token ids: the vocabulary (ids are drawn
            below it, and only the parameters are checked).
        ctx: the forward context (default: training at step 0).

    Returns:
        `max |analytic - numeric| / max(1, max |numeric|)` over every
        parameter and (for float inputs) the input.
    """
    rng = np.random.default_rng(seed)
    ctx = ForwardContext(train=True) if ctx is None else ctx
    params = [
        np.asarray(p, dtype=np.float64) + 0.1 * rng.standard_normal(np.shape(p))
        for p in layer.init_params(rng)
    ]
    shape = (batch, *in_shape)
    if tokens is None:
        x: Any = rng.standard_normal(shape)
    else:
        x = rng.integers(0, tokens, size=shape).astype(np.int64)
    y, saved = layer.forward(cpu_backend(), params, x, ctx)
    r = rng.standard_normal(np.shape(y))
    grads = [np.zeros_like(p) for p in params]
    dx = layer.backward(cpu_backend(), params, grads, saved, r, False, tokens is None)
    pairs = [
        (g, _numeric(layer, params, x, r, p, eps, ctx)) for g, p in zip(grads, params, strict=True)
    ]
    if tokens is None:
        pairs.append((np.asarray(dx), _numeric(layer, params, x, r, x, eps, ctx)))
    worst = 0.0
    for analytic, numeric in pairs:
        scale = max(1.0, float(np.max(np.abs(numeric))))
        worst = max(worst, float(np.max(np.abs(analytic - numeric))) / scale)
    return worst
