"""Checkpoints of a sharded trainer: the full format, or one file per replica.

By default `SaveCheckpoint` writes today's format (`core/checkpoint.py`):
the pieces of every replica, and of every process, are assembled into the
full weight vector and full optimizer buffers, so the file loads into any
trainer, and any trainer's checkpoint loads into a sharded one.

With `ShardedOptions.shard_checkpoints`, each replica's state goes to a file
of its own, `<path>.gen-<N>.shard-<g>-of-<G>` (`g`: the replica's place in
the job, process by process), written by the process that holds it; the
path itself then holds an *index*: a checkpoint in today's format whose
weights are empty and whose `extra["sharded"]` gives the shard count, the
generation `N` and the save's id: 32 random hex digits chosen by process 0
for each save, which every shard file of it holds too, so a shard file of
another save of the same step and generation is refused, not merged. `merge_shards(path)` (`core/sharded_index.py`) reads
the index and the shards back into one full `Checkpoint`; every trainer's
`LoadCheckpoint` does, so a sharded save loads into any layout, any replica
count and any trainer.

A save is crash-safe: each save writes a new generation of shard files
(one above any generation beside the path), every file atomically, then
the index, then deletes the older generations' files (and the temp files
a killed save of one left). Until the index is replaced it names the
previous save's files, which nothing has touched; a kill at any moment
leaves one whole checkpoint. A full-format save at the path deletes every
generation's files once its own file is in place (`save_checkpoint`; the
rule: `core/_shard_files.py`). Indexes written before generations existed
name `<path>.shard-<g>-of-<G>` and still load. Every file named like a
shard of `<path>` belongs to it: do not name another checkpoint
`<path>.gen-<N>`, whose shard files a save at `<path>` would take for its
own.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from atomr.train.core._shard_files import remove_shard_files, shard_generations
from atomr.train.core.checkpoint import (
    SHARDED_INDEX_KEY,
    Checkpoint,
    check_save_target,
    save_checkpoint,
)
from atomr.train.core.sharded_index import merge_shards, save_digest, shard_path
from atomr.train.sharded.layout import ShardLayout
from atomr.train.sharded.messages import ShardReplicaState

__all__ = [
    "assemble_state",
    "merge_shards",
    "next_generation",
    "save_digest",
    "shard_path",
    "split_state",
    "write_index",
    "write_shards",
]


def next_generation(path: str | Path) -> int:
    """The generation a new save at `path` writes: one above every
    generation of shard files beside it, so it overwrites none of them."""
    return max(shard_generations(path), default=0) + 1


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
    generation: int,
    save_id: str,
) -> None:
    """Write this process's replicas' files of save `generation`, each
    holding `save_id` (process 0's, the same on every process); process 0
    writes the index afterwards, once every process has: `write_index`.

    Raises:
        CheckpointError, OSError: as `save_checkpoint`; what it refuses about
            a path is checked for every file (the index too, on process 0)
            before any is written.
    """
    count = layout.replicas * layout.processes
    first = layout.process_rank * layout.replicas
    targets = [shard_path(path, first + k, count, generation) for k in range(len(states))]
    for target in [*targets, Path(path)] if layout.process_rank == 0 else targets:
        check_save_target(target)
    for k, state in enumerate(states):
        owned = [list(r) for r in layout.owned(k)]
        extra = {"owned": owned, "save": save_id}
        shard = Checkpoint(model, state.piece, state.steps, state.optimizer, extra)
        save_checkpoint(targets[k], shard)


def write_index(
    path: str | Path,
    layout: ShardLayout,
    steps: int,
    model: dict[str, Any],
    extra: dict[str, Any],
    generation: int,
    save_id: str,
) -> None:
    """Process 0, once every shard of `generation` is written: the index at
    `path` (atomically), naming `save_id` (its shards'), then the other
    generations' shard files go.

    Raises:
        CheckpointError, OSError: as `save_checkpoint` (the previous index
            and its shards are then untouched).
    """
    count = layout.replicas * layout.processes
    info = {"count": count, "n_params": layout.n_params, "generation": generation, "save": save_id}
    index = Checkpoint(
        model, np.zeros(0, np.float32), steps, {}, {SHARDED_INDEX_KEY: info, **extra}
    )
    save_checkpoint(path, index)
    remove_shard_files(path, keep=generation)
