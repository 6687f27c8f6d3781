"""The pipeline's side of the one checkpoint format: the whole model's
config from its stages, the stages' states merged into full vectors, and a
checkpoint cut back into one state per stage."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from atomr.train.core.checkpoint import Checkpoint
from atomr.train.pipeline.messages import StageInfo, StageState

__all__ = ["merge_stage_states", "model_config", "split_checkpoint"]


def model_config(infos: Sequence[StageInfo]) -> dict[str, Any]:
    """The whole model's config (`Mlp.config()` shape) from its stages' infos.

    Args:
        infos: every stage's `StageInfo`, in pipeline order.

    Returns:
        The config the single-device model of the same layers reports (an
        `Mlp`'s when the stages are `Mlp` slices: its `activate_last` is
        the last stage's, the others keep their activation by construction).
    """
    first = infos[0].model
    if "sizes" not in first:
        layers = [layer for info in infos for layer in info.model["layers"]]
        return {**first, "layers": layers, "seed": None}
    sizes = list(first["sizes"])
    for info in infos[1:]:
        sizes += list(info.model["sizes"][1:])
    return {
        "sizes": sizes,
        "activation": first["activation"],
        "dtype": infos[0].dtype,
        "activate_last": infos[-1].model.get("activate_last", False),
        "seed": None,
    }


def merge_stage_states(states: Sequence[StageState]) -> tuple[np.ndarray, dict[str, Any]]:
    """The full flat weights and full-vector optimizer state of the stages.

    Args:
        states: every stage's `StageState`, in pipeline order.

    Returns:
        `(weights, optimizer state_dict)`; an optimizer buffer is kept only
        when every stage has it.
    """
    optimizer: dict[str, Any] = {
        "kind": states[0].optimizer["kind"],
        "step": states[0].optimizer["step"],
    }
    buffers = {k for st in states for k, v in st.optimizer.items() if isinstance(v, np.ndarray)}
    for name in sorted(buffers):
        parts = [st.optimizer.get(name) for st in states]
        arrays = [a for a in parts if isinstance(a, np.ndarray)]
        if len(arrays) == len(parts):
            optimizer[name] = np.concatenate(arrays)
    return np.concatenate([st.weights for st in states]), optimizer


def split_checkpoint(ckpt: Checkpoint, offsets: Sequence[int]) -> list[StageState]:
    """One `StageState` per stage from a checkpoint of the whole model.

    Args:
        ckpt: a checkpoint checked to fit the model.
        offsets: where each stage's parameters start in the flat vector, and
            the total last (`[0, n_0, n_0 + n_1, ..., n]`).

    Returns:
        The stages' weights and optimizer states, in pipeline order.
    """
    n = offsets[-1]
    states = []
    for lo, hi in zip(offsets[:-1], offsets[1:], strict=True):
        optimizer = {
            k: (v[lo:hi] if isinstance(v, np.ndarray) and v.shape == (n,) else v)
            for k, v in ckpt.optimizer.items()
        }
        states.append(StageState(np.asarray(ckpt.weights[lo:hi]), optimizer))
    return states
