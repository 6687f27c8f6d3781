"""Models as layers over one flat parameter vector: the `Layer` protocol,
`Sequential`, the built-in layers and the GPT decoder (docs/models.md)."""

from atomr.train.core.model.gpt import gpt
from atomr.train.core.model.gradcheck import gradient_check
from atomr.train.core.model.layer import ForwardContext, Layer
from atomr.train.core.model.linear import Activation, Linear
from atomr.train.core.model.registry import LAYERS, layer_from_config, register_layer
from atomr.train.core.model.sequential import Sequential, SequentialTape
from atomr.train.core.model.structure import Dropout, Residual
from atomr.train.core.model.transformer import CausalSelfAttention, Embedding, LayerNorm

__all__ = [
    "LAYERS",
    "Activation",
    "CausalSelfAttention",
    "Dropout",
    "Embedding",
    "ForwardContext",
    "Layer",
    "LayerNorm",
    "Linear",
    "Residual",
    "Sequential",
    "SequentialTape",
    "gpt",
    "gradient_check",
    "layer_from_config",
    "register_layer",
]
