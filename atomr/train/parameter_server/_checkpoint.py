"""Server shards' states to and from the one checkpoint format.

The weight vector and the optimizer's buffers are cut into contiguous
ranges, one per server shard; a checkpoint holds them whole (the
`atomr.train.core.checkpoint` format every trainer reads and writes). The
trainer and a lone server shard both go through these two functions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from atomr.train.core.accumulation import check_resumable_window
from atomr.train.core.checkpoint import (
    Checkpoint,
    check_model_matches,
    check_optimizer_state,
)
from atomr.train.core.optimizer import OptimizerKind
from atomr.train.parameter_server.messages import ServerState

__all__ = ["checkpoint_of", "server_states"]


def checkpoint_of(
    states: Sequence[ServerState], model_config: Mapping[str, Any], workers: int | None = None
) -> Checkpoint:
    """One checkpoint of the whole vector from every range's state, in range order.

    Args:
        states: one `ServerState` per range.
        model_config: the model's `Mlp.config()`.
        workers: the workers that pushed (recorded: each counts a step per
            batch), if known.

    Returns:
        The checkpoint (step: the first shard's version).
    """
    optimizer: dict[str, Any] = dict(states[0].optimizer)
    for key, value in states[0].optimizer.items():
        if isinstance(value, np.ndarray):
            optimizer[key] = np.concatenate([np.asarray(s.optimizer[key]) for s in states])
    return Checkpoint(
        model=dict(model_config),
        weights=np.concatenate([np.asarray(s.weights) for s in states]),
        step=states[0].version,
        optimizer=optimizer,
        extra={
            "trainer": "AsyncParameterServer",
            "shards": len(states),
            **({} if workers is None else {"workers": workers}),
        },
    )


def server_states(
    ckpt: Checkpoint,
    ranges: Sequence[tuple[int, int]],
    optimizer: OptimizerKind,
    model_config: Mapping[str, Any],
    loader: str,
) -> list[ServerState]:
    """Cut a checkpoint into one state per range, checking everything first.

    Args:
        ckpt: a checkpoint of any trainer.
        ranges: `(start, stop)` of each shard, tiling the whole vector.
        optimizer: the shards' optimizer (the checkpoint's must be of its kind).
        model_config: the model's `Mlp.config()` (the checkpoint's must match).
        loader: the loading actor's class name, for the messages.

    Returns:
        One `ServerState` per range.

    Raises:
        CheckpointError: the checkpoint is for another model, holds
            optimizer state of another kind or shape
            (`check_optimizer_state`), or was saved in the middle of a
            gradient accumulation, which a parameter server cannot resume
            (`check_resumable_window`).
    """
    n = ranges[-1][1]
    check_model_matches(ckpt, model_config, n)
    check_optimizer_state(ckpt, optimizer, n)
    check_resumable_window(ckpt, 1, loader)  # the servers do not accumulate
    return [
        ServerState(
            ckpt.weights[lo:hi],
            {k: (v[lo:hi] if isinstance(v, np.ndarray) else v) for k, v in ckpt.optimizer.items()},
            int(ckpt.step),
        )
        for lo, hi in ranges
    ]
