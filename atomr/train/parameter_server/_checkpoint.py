"""Server shards' states to and from the one checkpoint format.

The weight vector and the optimizer's buffers are cut into contiguous
ranges, one per server shard; a checkpoint holds them whole (the
`atomr.train.core.checkpoint` format every trainer reads and writes). The
trainer and a lone server shard both go through `checkpoint_of` and
`server_states`; the trainer saves and loads its shards with `save_servers`
and `load_servers` (all or none: `load_all_or_none`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from atomr.actor import ActorRef
from atomr.train.comm._fanout import ask_all, load_all_or_none
from atomr.train.core.accumulation import check_resumable_window
from atomr.train.core.checkpoint import (
    Checkpoint,
    check_model_matches,
    check_optimizer_state,
    save_checkpoint,
)
from atomr.train.core.optimizer import OptimizerKind
from atomr.train.parameter_server.messages import GetServerState, ServerState, SetServerState

__all__ = ["checkpoint_of", "load_servers", "save_servers", "server_states"]


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
    dtype: Any,
) -> list[ServerState]:
    """Cut a checkpoint into one state per range, checking everything first.

    Args:
        ckpt: a checkpoint of any trainer.
        ranges: `(start, stop)` of each shard, tiling the whole vector.
        optimizer: the shards' optimizer (the checkpoint's must be of its kind).
        model_config: the model's `Mlp.config()` (the checkpoint's must match).
        loader: the loading actor's class name, for the messages.
        dtype: the model's dtype (the weights and optimizer state are
            checked in it: wider weights would be rounded).

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
    check_model_matches(ckpt, model_config, n, dtype)
    check_optimizer_state(ckpt, optimizer, n, dtype)
    check_resumable_window(ckpt, 1, loader)  # the servers do not accumulate
    return [
        ServerState(
            ckpt.weights[lo:hi],
            {k: (v[lo:hi] if isinstance(v, np.ndarray) else v) for k, v in ckpt.optimizer.items()},
            int(ckpt.step),
        )
        for lo, hi in ranges
    ]


async def save_servers(
    servers: Sequence[ActorRef],
    path: Any,
    model_config: Mapping[str, Any],
    workers: int,
    timeout: float | None,
) -> None:
    """Every server shard's range (in range order) saved as one checkpoint at `path`.

    Args:
        servers: the server shards, in range order.
        path: where to save (`save_checkpoint`).
        model_config: the model's `Mlp.config()`.
        workers: the number of workers (recorded in the checkpoint).
        timeout: each ask's timeout in seconds (None: wait forever).

    Raises:
        Exception: a shard's failure to give its state, or its refusal
            (`GetServerState.to_save`: its state is known to be wrong)
            (nothing was written), or `save_checkpoint`'s.
    """
    states = await ask_all(servers, GetServerState(to_save=True), timeout, per_worker=False)
    ckpt = checkpoint_of(states, model_config, workers)
    await asyncio.to_thread(save_checkpoint, path, ckpt)


async def load_servers(
    servers: Sequence[ActorRef],
    states: Sequence[ServerState],
    keep_old: bool,
    timeout: float | None,
) -> None:
    """Give every server shard its state (`server_states`), all or none
    (`load_all_or_none`): if one fails, every shard is given back its state
    from before the load (weights, optimizer state, version, and a refusal
    to serve: a shard whose state was known to be wrong keeps refusing).

    Args:
        servers: the server shards, in range order.
        states: one state per shard.
        keep_old: ask every shard its state first, to give it back after a
            failure; False when a shard's state is lost anyway (a restarted
            shard: there is nothing consistent to go back to).
        timeout: each ask's timeout in seconds (None: wait forever).

    Raises:
        Exception: a shard's failure to give its old state (nothing was
            loaded), or the first shard's failure to load (`worker_index`
            set, a note saying whether every shard has its old state back).
    """
    restore = None
    if keep_old:
        old = await ask_all(servers, GetServerState(), timeout, per_worker=False)
        restore = [SetServerState(s) for s in old]
    messages = [SetServerState(s) for s in states]
    await load_all_or_none(servers, messages, restore, timeout, "server shard")
