"""The GPT against an independent float64 NumPy reference of the same
architecture (pre-LayerNorm blocks, causal softmax attention, tanh-GELU
MLP, mean cross-entropy over every token), written out here from the
architecture alone and reading the same flat weight vector: the loss is the
reference's, and the model's gradients equal central differences of the
reference's loss."""

from __future__ import annotations

import math

import numpy as np
import pytest

from atomr.train.core.loss import LossKind
from atomr.train.core.model import gpt

V, T, D, H, LAYERS = 7, 5, 8, 2, 2
DIMS = (V, T, D, H, LAYERS)


def _take(flat: np.ndarray, at: int, *shape: int) -> tuple[np.ndarray, int]:
    size = int(np.prod(shape))
    return flat[at : at + size].reshape(shape), at + size


def _layernorm(x: np.ndarray, g: np.ndarray, b: np.ndarray) -> np.ndarray:
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-5) * g + b


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def _attention(
    x: np.ndarray, w: np.ndarray, b: np.ndarray, wo: np.ndarray, bo: np.ndarray, heads: int
) -> np.ndarray:
    batch, t_len, d = x.shape
    dh = d // heads
    qkv = x @ w + b
    q, k, v = (
        qkv[..., i * d : (i + 1) * d].reshape(batch, t_len, heads, dh).transpose(0, 2, 1, 3)
        for i in range(3)
    )
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(dh) + np.triu(
        np.full((t_len, t_len), -np.inf), 1
    )
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return (p @ v).transpose(0, 2, 1, 3).reshape(batch, t_len, d) @ wo + bo


def reference_loss(
    flat: np.ndarray, ids: np.ndarray, labels: np.ndarray, dims: tuple[int, ...] = DIMS
) -> float:
    """Mean next-token cross-entropy of the GPT of `dims` (vocab, context,
    width, heads, blocks) whose weights are `flat`."""
    V, T, D, H, LAYERS = dims  # noqa: N806 - the module's names for them
    tok, at = _take(flat, 0, V, D)
    pos, at = _take(flat, at, T, D)
    h = tok[ids] + pos[: ids.shape[1]]
    for _ in range(LAYERS):
        g1, at = _take(flat, at, D)
        b1, at = _take(flat, at, D)
        w, at = _take(flat, at, D, 3 * D)
        b, at = _take(flat, at, 3 * D)
        wo, at = _take(flat, at, D, D)
        bo, at = _take(flat, at, D)
        h = h + _attention(_layernorm(h, g1, b1), w, b, wo, bo, H)
        g2, at = _take(flat, at, D)
        b2, at = _take(flat, at, D)
        w1, at = _take(flat, at, D, 4 * D)
        c1, at = _take(flat, at, 4 * D)
        w2, at = _take(flat, at, 4 * D, D)
        c2, at = _take(flat, at, D)
        h = h + _gelu(_layernorm(h, g2, b2) @ w1 + c1) @ w2 + c2
    gf, at = _take(flat, at, D)
    bf, at = _take(flat, at, D)
    wh, at = _take(flat, at, D, V)
    bh, at = _take(flat, at, V)
    assert at == flat.size
    logits = _layernorm(h, gf, bf) @ wh + bh
    logits = logits - logits.max(-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return float(-np.take_along_axis(logp, labels[..., None], -1).mean())


@pytest.mark.parametrize(
    ("dims", "batch"),
    [
        (DIMS, 3),
        ((2, 1, 1, 1, 1), 1),  # vocab 2, one token, width 1: one head of width 1
        ((2, 3, 4, 4, 1), 1),  # four heads of width 1
        ((3, 2, 3, 1, 2), 2),  # one head of width 3, two blocks
    ],
    ids=["default", "vocab2-T1-d1", "heads-of-width-1", "one-head"],
)
def test_the_gpt_equals_an_independent_float64_reference(dims: tuple[int, ...], batch: int) -> None:
    vocab, context, width, heads, blocks = dims
    rng = np.random.default_rng(11)
    model = gpt(
        vocab, context, n_layer=blocks, n_head=heads, d_model=width, seed=4, dtype=np.float64
    )
    flat = model.get_params() + 0.05 * rng.standard_normal(
        model.n_params
    )  # no trivially-0 gradient
    model.set_params(flat)
    ids = rng.integers(0, vocab, size=(batch, context))
    labels = rng.integers(0, vocab, size=(batch, context))
    tape = model.forward_train(ids)
    d_out = np.empty(tape.output.shape)
    loss_sum, norm = LossKind.CROSS_ENTROPY.sums(model.backend, tape.output, labels, d_out)
    want = reference_loss(flat, ids, labels, dims)
    assert loss_sum / norm == np.float64(want) or abs(loss_sum / norm - want) < 1e-12
    model.backward(tape, d_out / norm)
    grads = model.backend.to_host(model.grads)
    # central differences of the reference at positions drawn from every layer's range
    picks = np.concatenate([rng.integers(a, b, size=4) for a, b in model.layer_ranges() if b > a])
    eps = 1e-6
    for i in picks:
        up, down = flat.copy(), flat.copy()
        up[i] += eps
        down[i] -= eps
        numeric = (
            reference_loss(up, ids, labels, dims) - reference_loss(down, ids, labels, dims)
        ) / (2 * eps)
        assert abs(grads[i] - numeric) < 1e-7 * max(1.0, abs(numeric)), (i, grads[i], numeric)
