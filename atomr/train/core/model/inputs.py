"""What a model takes: its input kind, its dtype and, for token ids, their
range; checked once, where a model (or a server holding its weights) is
built."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["INPUT_KINDS", "model_dtype", "token_vocab"]

INPUT_KINDS = ("float", "tokens")
"""What a model takes: float features (of the model's dtype) or int64 token ids."""


def model_dtype(dtype: Any) -> np.dtype:
    """`dtype` as a NumPy dtype, checked to be one a model computes in.

    Raises:
        ValueError: not float32 or float64.
    """
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise ValueError(f"dtype must be float32 or float64, got {dtype!r}") from exc
    if dt not in (np.float32, np.float64):
        raise ValueError(f"dtype must be float32 or float64, got {dt}")
    return dt


def token_vocab(layer: Any) -> int:
    """The range of the token ids `layer`, a token model's first, takes.

    Raises:
        ValueError: it has no `vocab` attribute, or one that is not an int >= 1.
    """
    vocab = getattr(layer, "vocab", None)
    if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 1:
        raise ValueError(
            f"input_kind 'tokens' needs a first layer that says its vocabulary (an int "
            f"`vocab` >= 1, as Embedding has); {type(layer).__name__} has {vocab!r}"
        )
    return vocab
