"""The models atomr builds from a config: an `Mlp` (its own keys: sizes,
activation, ...) or any `Sequential` (a list of layer configs), and what each
takes and gives (`batch_spec`). Checkpoints store the config, so any model
round-trips through any trainer that trains it."""

from __future__ import annotations

from typing import Any

import numpy as np

from atomr.train.core.mlp import Mlp
from atomr.train.core.model.inputs import token_vocab
from atomr.train.core.model.registry import layer_from_config
from atomr.train.core.model.sequential import Sequential
from atomr.train.core.validation import BatchSpec

__all__ = ["batch_spec", "model_from_config"]


def model_from_config(config: dict[str, Any], params: np.ndarray, device: Any = None) -> Sequential:
    """The model `config` describes, holding `params`.

    Raises:
        ValueError: a config that does not build, or `params` of the wrong length.
    """
    if "layers" in config:
        return Sequential.from_config(config, params, device)
    return Mlp.from_config(config, params, device)


def batch_spec(config: dict[str, Any]) -> BatchSpec:
    """What the model of `config` takes and gives, without building its parameters.

    Raises:
        ValueError: a config that does not build.
    """
    dtype = config.get("dtype", "float32")
    if "layers" not in config:
        sizes = config["sizes"]
        return BatchSpec((int(sizes[0]),), (int(sizes[-1]),), "float", None, dtype)
    layers = [layer_from_config(c) for c in config["layers"]]
    kind = config.get("input_kind", "float")
    vocab = token_vocab(layers[0]) if kind == "tokens" else None
    shape = in_shape = tuple(int(s) for s in config.get("input_shape", ()))
    for layer in layers:
        shape = layer.out_shape(shape)
    return BatchSpec(in_shape, shape, kind, vocab, dtype)
