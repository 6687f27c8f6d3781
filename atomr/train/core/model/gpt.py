"""`gpt(...)`: a GPT-style decoder as a `Sequential`.

    Embedding (token + position)
    n_layer x [ Residual(LayerNorm, CausalSelfAttention, Dropout),
                Residual(LayerNorm, Linear d->4d (column), GELU, Linear 4d->d (row), Dropout) ]
    LayerNorm, Linear d->vocab

The pre-LayerNorm block of GPT-2, without weight tying. It takes `(B, T)`
token ids and gives `(B, T, vocab)` logits; train it with cross-entropy over
every position (labels: the next tokens, `(B, T)`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from atomr._arguments import array_bytes, int_at_least
from atomr.train.core.model.inputs import model_dtype, positive_int
from atomr.train.core.model.layer import Layer
from atomr.train.core.model.linear import Activation, Linear
from atomr.train.core.model.sequential import Sequential
from atomr.train.core.model.structure import Dropout, Residual, drop_probability
from atomr.train.core.model.transformer import CausalSelfAttention, Embedding, LayerNorm

__all__ = ["gpt"]


def _block(d: int, n_head: int, dropout: float, seed: int) -> list[Layer]:
    attention: list[Layer] = [LayerNorm(d), CausalSelfAttention(d, n_head)]
    mlp: list[Layer] = [
        LayerNorm(d),
        Linear(d, 4 * d),
        Activation("gelu"),
        Linear(4 * d, d, tp="row"),
    ]
    if dropout > 0:  # a Dropout seed is 32 bits; the model's seed may be any int
        attention.append(Dropout(dropout, seed=seed % 2**32))
        mlp.append(Dropout(dropout, seed=(seed + 1) % 2**32))
    return [Residual(attention), Residual(mlp)]


def gpt(
    vocab: int,
    context: int,
    *,
    n_layer: int = 2,
    n_head: int = 4,
    d_model: int = 64,
    dropout: float = 0.0,
    seed: int = 0,
    dtype: Any = np.float32,
    device: Any = None,
) -> Sequential:
    """A GPT-style decoder (module docstring).

    Args:
        vocab: token ids (and output classes).
        context: the sequence length it takes.
        n_layer: transformer blocks.
        n_head: attention heads; must divide `d_model`.
        d_model: the width.
        dropout: the dropout probability after attention and after each
            block's MLP (0: none).
        seed: the initialisation's seed; block i's dropout layers get
            `(seed + 2i) % 2**32` and `(seed + 2i + 1) % 2**32`.
        dtype, device: as for `Sequential`.

    Returns:
        The model.

    Raises:
        ValueError: a size (`vocab`, `context`, `n_layer`, `n_head`,
            `d_model`) that is not a positive int (a bool or a float is not),
            `n_head` not dividing `d_model`, or `dropout` not a number in
            [0, 1), or parameters more than an array holds (`array_bytes`);
            checked before any layer is built (the message names it).
        TypeError: `seed` is not an int (a bool is none).
        ValueError: `seed` is negative.
    """
    sizes = {
        "vocab": vocab,
        "context": context,
        "n_layer": n_layer,
        "n_head": n_head,
        "d_model": d_model,
    }
    for name, size in sizes.items():
        positive_int(name, size)
    dropout = drop_probability("dropout", dropout)
    seed = int_at_least("seed", seed, 0, high=None)
    ends: list[Layer] = [
        Embedding(vocab, d_model, context),
        LayerNorm(d_model),
        Linear(d_model, vocab),
    ]
    per_block = sum(layer.n_params for layer in _block(d_model, n_head, dropout, seed))
    n_params = sum(layer.n_params for layer in ends) + n_layer * per_block
    # counted before the n_layer blocks are made: 10**18 of them would never end
    array_bytes("a GPT's parameters", n_params, model_dtype(dtype).itemsize)
    layers = ends[:1]
    for i in range(n_layer):
        layers += _block(d_model, n_head, dropout, seed + 2 * i)
    layers += ends[1:]
    return Sequential(
        layers, (context,), input_kind="tokens", seed=seed, dtype=dtype, device=device
    )
