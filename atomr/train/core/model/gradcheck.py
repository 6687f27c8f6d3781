"""`gradient_check`: a layer's backward against float64 central differences.

For a layer of your own: `assert gradient_check(MyLayer(...), (T, d)) < 1e-6`.
The backward is checked in each of its modes, as the trainers call it:
overwriting or adding into gradient buffers (`accumulate`: micro-batches
and accumulation steps add), with and without the input gradient
(`input_grad`: a model's first layer is not asked for it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from atomr._arguments import int_at_least, real_number
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


def _backward(
    layer: Layer,
    params: list[np.ndarray],
    x: np.ndarray,
    r: np.ndarray,
    ctx: ForwardContext,
    prefill: list[np.ndarray],
    accumulate: bool,
    input_grad: bool,
) -> tuple[list[np.ndarray], Any]:
    """A fresh forward, then the backward of `sum(y * r)` into copies of
    `prefill`: `(grads, dx)`.

    Raises:
        ValueError: an input gradient returned when `input_grad` is False.
    """
    _, saved = layer.forward(cpu_backend(), params, x, ctx)
    grads = [g.copy() for g in prefill]
    dx = layer.backward(cpu_backend(), params, grads, saved, r.copy(), accumulate, input_grad)
    if not input_grad and dx is not None:
        raise ValueError(
            f"{type(layer).__name__}.backward returned an input gradient with input_grad=False"
        )
    return grads, dx


def _error(analytic: Any, numeric: np.ndarray, what: str) -> float:
    """`max |analytic - numeric| / max(1, max |numeric|)`: infinite when
    either holds a NaN or an infinity (a NaN would compare as no error).

    Raises:
        ValueError: `analytic` is missing or not of `numeric`'s shape (it
            would broadcast).
    """
    if analytic is None or np.shape(analytic) != numeric.shape:
        shown = "none" if analytic is None else f"shape {np.shape(analytic)}"
        raise ValueError(f"{what}: the backward gave {shown}, expected shape {numeric.shape}")
    diff = np.abs(np.asarray(analytic, dtype=np.float64) - numeric)
    if not (np.isfinite(diff).all() and np.isfinite(numeric).all()):
        return math.inf
    scale = max(1.0, float(np.max(np.abs(numeric), initial=0.0)))
    return float(np.max(diff, initial=0.0)) / scale


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
    random input, the loss `sum(y * r)` for a random `r`. The backward runs
    in each mode (`accumulate` False and True, `input_grad` True and False;
    only False for token ids), after its own forward, into gradient buffers
    pre-filled with random values: overwritten, they must equal the
    numeric gradient; accumulated, the pre-filled values plus it.

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
        `max |analytic - numeric| / max(1, max |numeric|)` over every mode,
        every parameter and (for float inputs, when asked) the input;
        infinite when a gradient, analytic or numeric, is NaN or infinite.

    Raises:
        TypeError: `batch` or `seed` not an int, `eps` not a number.
        ValueError: `batch` below 1, `seed` negative, `eps` not finite and
            positive; the backward returns an input gradient when not asked
            for one, none when asked, or one of another shape than the input.
    """
    batch, seed = int_at_least("batch", batch), int_at_least("seed", seed, 0, high=None)
    step = real_number("eps", eps)
    if not (math.isfinite(step) and step > 0):
        raise ValueError(f"eps must be finite and > 0, got {eps!r}")
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
    y, _ = layer.forward(cpu_backend(), params, x, ctx)
    r = rng.standard_normal(np.shape(y))
    numeric = [_numeric(layer, params, x, r, p, step, ctx) for p in params]
    dx_numeric = _numeric(layer, params, x, r, x, step, ctx) if tokens is None else None
    prefill = [rng.standard_normal(p.shape) for p in params]
    worst = 0.0
    for accumulate in (False, True):
        for input_grad in sorted({False, tokens is None}):
            grads, dx = _backward(layer, params, x, r, ctx, prefill, accumulate, input_grad)
            for k, (g, base, want) in enumerate(zip(grads, prefill, numeric, strict=True)):
                worst = max(worst, _error(g - base if accumulate else g, want, f"parameter {k}"))
            if input_grad and dx_numeric is not None:
                worst = max(worst, _error(dx, dx_numeric, "the input gradient"))
    return worst
