"""Checkpoints of a sharded trainer: the full format, or one file per replica.

By default `SaveCheckpoint` writes today's format (`core/checkpoint.py`):
the pieces of every replica, and of every process, are assembled into the
full weight vector and full optimizer buffers, so the file loads into any
trainer, and any trainer's checkpoint loads into a sharded one.

With `ShardedOptions.shard_checkpoints`, each replica's state goes to a file
of its own, `<path>.shard-<g>-of-<G>` (`g`: the replica's place in the job,
process by process), written by the process that holds it; the path itself
then holds an *index*: a checkpoint in today's format whose weights are
empty and whose `extra["sharded"]` lists the files and the layout. Every
file is written atomically, the index last. `merge_shards(path)` reads the
index and the shards back into one full `Checkpoint` (what `LoadCheckpoint`
does with such a path), so a sharded save loads into any layout, any
replica count and any trainer.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from atomr.train.core.checkpoint import (
    SHARDED_INDEX_KEY,
    Checkpoint,
    CheckpointError,
    check_save_target,
    load_checkpoint,
    save_checkpoint,
)
from atomr.train.sharded.layout import ShardLayout
from atomr.train.sharded.messages import ShardReplicaState

__all__ = ["assemble_state", "merge_shards", "shard_path", "split_state", "write_shards"]


def shard_path(path: str | Path, index: int, count: int) -> Path:
    """The file of shard `index` of `count` next to the index at `path`."""
    return Path(f"{path}.shard-{index}-of-{count}")


def assemble_state(
    layout: ShardLayout, states: Sequence[ShardReplicaState], dtype: np.dtype
) -> tuple[np.ndarray, dict[str, Any]]:
    """This process's part of the full weights and optimizer state: every
    local replica's piece put in place (other processes' positions are 0).

    Returns:
        The weights and the optimizer's `state_dict` over the full vector
        (its scalars from replica 0).
    """
    weights = layout.assemble([s.piece for s in states], dtype)
    optimizer: dict[str, Any] = {}
    for key, value in states[0].optimizer.items():
        if isinstance(value, np.ndarray):
            optimizer[key] = layout.assemble([s.optimizer[key] for s in states], value.dtype)
        else:
            optimizer[key] = value
    return weights, optimizer


def split_state(
    layout: ShardLayout, weights: np.ndarray, optimizer: dict[str, Any], steps: int
) -> list[ShardReplicaState]:
    """Each local replica's part of a full state (the inverse of `assemble_state`)."""
    states = []
    for k in range(layout.replicas):
        part: dict[str, Any] = {}
        for key, value in optimizer.items():
            part[key] = layout.take(value, k) if isinstance(value, np.ndarray) else value
        states.append(ShardReplicaState(layout.take(weights, k), part, steps))
    return states


def write_shards(
    path: str | Path,
    layout: ShardLayout,
    states: Sequence[ShardReplicaState],
    model: dict[str, Any],
    extra: dict[str, Any],
) -> None:
    """Write this process's replicas' files, then (process 0) the index.

    Raises:
        CheckpointError, OSError: as `save_checkpoint`; what it refuses about
            a path is checked for every file before any is written.
    """
    count = layout.replicas * layout.processes
    first = layout.process_rank * layout.replicas
    targets = [shard_path(path, first + k, count) for k in range(len(states))]
    for target in [*targets, Path(path)] if layout.process_rank == 0 else targets:
        check_save_target(target)
    for k, state in enumerate(states):
        owned = [list(r) for r in layout.owned(k)]
        shard = Checkpoint(model, state.piece, state.steps, state.optimizer, {"owned": owned})
        save_checkpoint(targets[k], shard)
    if layout.process_rank == 0:
        index = {SHARDED_INDEX_KEY: {"count": count, "n_params": layout.n_params}, **extra}
        save_checkpoint(
            path, Checkpoint(model, np.zeros(0, np.float32), states[0].steps, {}, index)
        )


def merge_shards(path: str | Path, index: Checkpoint | None = None) -> Checkpoint:
    """The full checkpoint a sharded save at `path` stands for.

    Args:
        path: the index file.
        index: the index, when already read.

    Returns:
        A `Checkpoint` in the full format; a checkpoint that is not an
        index is returned as it is.

    Raises:
        CheckpointError: a shard is missing, unreadable, of another model or
            step, or the shards do not tile the vector exactly once.
    """
    ckpt = load_checkpoint(path) if index is None else index
    info = ckpt.extra.get(SHARDED_INDEX_KEY)
    if info is None:
        return ckpt
    try:
        count, n = int(info["count"]), int(info["n_params"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{path}: a bad shard index: {exc}") from exc
    covered = np.zeros(n, dtype=np.int64)
    weights: np.ndarray | None = None
    optimizer: dict[str, Any] = {}
    for g in range(count):
        shard = load_checkpoint(shard_path(path, g, count))
        if shard.model != ckpt.model or shard.step != ckpt.step:
            raise CheckpointError(f"shard {g} of {path} is of another model or step")
        weights = _place(shard, shard.weights, weights, n, covered, g)
        for key, value in shard.optimizer.items():
            if isinstance(value, np.ndarray):
                optimizer[key] = _place(shard, value, optimizer.get(key), n, None, g)
            else:
                optimizer.setdefault(key, value)
    if weights is None or not (covered == 1).all():
        raise CheckpointError(f"the shards of {path} do not cover the parameters exactly once")
    extra = {k: v for k, v in ckpt.extra.items() if k != SHARDED_INDEX_KEY}
    return Checkpoint(ckpt.model, weights, ckpt.step, optimizer, extra)


def _place(
    shard: Checkpoint,
    piece: np.ndarray,
    full: np.ndarray | None,
    n: int,
    covered: np.ndarray | None,
    g: int,
) -> np.ndarray:
    """Put one shard's piece at the positions its `owned` list names."""
    if full is None:
        full = np.zeros(n, dtype=piece.dtype)
    at = 0
    try:
        ranges = [(int(lo), int(hi)) for lo, hi in shard.extra["owned"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"shard {g} has no valid owned ranges: {exc}") from exc
    for lo, hi in ranges:
        if not 0 <= lo <= hi <= n or at + hi - lo > piece.shape[0]:
            raise CheckpointError(f"shard {g}: range {lo}:{hi} does not fit")
        full[lo:hi] = piece[at : at + hi - lo]
        if covered is not None:
            covered[lo:hi] += 1
        at += hi - lo
    if at != piece.shape[0]:
        raise CheckpointError(f"shard {g}: {piece.shape[0]} values for {at} positions")
    return full
