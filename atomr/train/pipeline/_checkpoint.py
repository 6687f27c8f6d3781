"""The pipeline's side of the one checkpoint format: the whole model's
config from its stages (and the check that they make one model it can
name), the stages' states merged into full vectors, and a checkpoint cut
back into one state per stage."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from atomr.train.core.checkpoint import Checkpoint
from atomr.train.pipeline.messages import StageInfo, StageState

__all__ = ["check_one_model", "merge_stage_states", "model_config", "split_checkpoint"]


def check_one_model(infos: Sequence[StageInfo]) -> None:
    """Check that the stages make one model `model_config` names truly: one
    dtype, token ids taken by stage 0 only, and either no `Mlp` slice or
    only slices of one `Mlp` (one activation, applied after every stage but
    the last, as `Mlp.slice_layers` cuts it). Stages built otherwise (by hand, for `props`) would train a
    model other than the one their checkpoints name, and load into it.

    Raises:
        ValueError: the first stage that breaks this, named with stage 0.
    """
    first = infos[0]
    mlp = "sizes" in first.model
    for k, info in enumerate(infos):
        if info.dtype != first.dtype:  # one model, one dtype: none rounded
            raise ValueError(f"stage {k} computes in {info.dtype}, stage 0 in {first.dtype}")
        if ("sizes" in info.model) != mlp:
            raise ValueError(
                f"stage {k} is {'not ' if mlp else ''}an Mlp slice and stage 0 is"
                f"{'' if mlp else ' not'}: the stages are slices of one Mlp, or none is one"
            )
        if k > 0 and info.model.get("input_kind", "float") != "float":
            raise ValueError(
                f"stage {k} takes token ids, but only stage 0 takes the batch: every later "
                "stage takes the float outputs of the stage before it"
            )
        if not mlp:
            continue
        if info.model["activation"] != first.model["activation"]:
            raise ValueError(
                f"stage {k} applies {info.model['activation']!r}, stage 0 "
                f"{first.model['activation']!r}: an Mlp has one activation"
            )
        if k < len(infos) - 1 and not info.model.get("activate_last", False):
            raise ValueError(
                f"stage {k} does not end in its activation (activate_last=False) but is not "
                "the last stage: an Mlp applies it after every layer but the last "
                "(cut the stages with Mlp.slice_layers)"
            )


def model_config(infos: Sequence[StageInfo]) -> dict[str, Any]:
    """The whole model's config (`Mlp.config()` shape) from its stages' infos.

    Args:
        infos: every stage's `StageInfo`, in pipeline order.

    Returns:
        The config the single-device model of the same layers reports (an
        `Mlp`'s when the stages are `Mlp` slices: its `activate_last` is
        the last stage's, the others keep their activation, as
        `check_one_model` checked).
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
