"""The models atomr builds from a config: an `Mlp` (its own keys: sizes,
activation, ...) or any `Sequential` (a list of layer configs), and what each
takes and gives (`batch_spec`). Checkpoints store the config, so any model
round-trips through any trainer that trains it."""

from __future__ import annotations

from typing import Any

import numpy as np

from atomr.train.core.mlp import Mlp
from atomr.train.core.model.inputs import token_vocab
from atomr.train.core.model.sequential import Sequential
from atomr.train.core.validation import BatchSpec

__all__ = ["batch_spec", "model_from_config"]


def model_from_config(config: dict[str, Any], params: np.ndarray, device: Any = None) -> Sequential:
    """The model `config` describes, holding `params`.

    Raises:
        TypeError: `config` is not a dict, or `params` are not real numbers.
        ValueError: a config that does not build (a missing key, a key no
            version of atomr wrote, a value of the wrong type or range, an
            unknown layer kind, layers nested too deep; the message names
            it), or `params` of the wrong length or not finite in the
            model's dtype (NaN, Inf, too large for it).
    """
    return _model_class(config).from_config(config, params, device)


def batch_spec(config: dict[str, Any]) -> BatchSpec:
    """What the model of `config` takes and gives, without building its parameters.

    Raises:
        TypeError: `config` is not a dict.
        ValueError: a config that does not build, as for `model_from_config`.
    """
    model = _model_class(config)._unloaded(config)
    vocab = token_vocab(model.layers[0]) if model.input_kind == "tokens" else None
    return BatchSpec(model.in_shape, model.out_shape, model.input_kind, vocab, model.dtype)


def _model_class(config: Any) -> type[Sequential]:
    """`Sequential` for a config with `layers`, else `Mlp` (whose `sizes` it checks).

    Raises:
        TypeError: `config` is not a dict.
    """
    if not isinstance(config, dict):
        raise TypeError(f"a model config is a dict, got {type(config).__name__}")
    return Sequential if "layers" in config else Mlp
