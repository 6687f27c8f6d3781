"""Checkpoints of a sharded trainer: the full format, or one file per replica.

By default `SaveCheckpoint` writes today's format (`core/checkpoint.py`):
the pieces of every replica, and of every process, are assembled into the
full weight vector and full optimizer buffers, so the file loads into any
trainer, and any trainer's checkpoint loads into a sharded one.

With `ShardedOptions.shard_checkpoints`, each replica's state goes to a file
of its own, `<path>.gen-<N>.shard-<g>-of-<G>` (`g`: the replica's place in
the job, process by process), written by the process that holds it; the
path itself then holds an *index*: a checkpoint in today's format whose
weights are empty and whose `extra["sharded"]` gives the shard count and
the generation `N`. `merge_shards(path)` reads the index and the shards
back into one full `Checkpoint` (what `LoadCheckpoint` does with such a
path), so a sharded save loads into any layout, any replica count and any
trainer.

A save is crash-safe: each save writes a new generation of shard files
(one above any generation beside the path), every file atomically, then
the index, then deletes the older generations' files (and the temp files
a killed save of one left). Until the index is replaced it names the
previous save's files, which nothing has touched; a kill at any moment
leaves one whole checkpoint. Indexes written before generations existed
name `<path>.shard-<g>-of-<G>` and still load. Every file named like a
shard of `<path>` belongs to it: do not name another checkpoint
`<path>.gen-<N>`, whose shard files a save at `<path>` would take for its
own.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from atomr.train.core.checkpoint import (
    SHARDED_INDEX_KEY,
    Checkpoint,
    CheckpointError,
    check_save_target,
    checkpoint_digest,
    load_checkpoint,
    save_checkpoint,
)
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


def shard_path(path: str | Path, index: int, count: int, generation: int = 0) -> Path:
    """The file of shard `index` of `count`, of save `generation`, next to
    the index at `path` (generation 0: the name of indexes written before
    generations existed)."""
    if generation == 0:
        return Path(f"{path}.shard-{index}-of-{count}")
    return Path(f"{path}.gen-{generation}.shard-{index}-of-{count}")


def _generations(path: str | Path) -> dict[int, list[Path]]:
    """The shard files beside `path` by generation, with the temp files a
    killed write of one left (`.<shard file>.<8 characters>.tmp`)."""
    target = Path(path)
    shard = re.escape(target.name) + r"(?:\.gen-(\d+))?\.shard-\d+-of-\d+"
    pattern = re.compile(rf"(?:{shard}|\.{shard}\.[A-Za-z0-9_]{{8}}\.tmp)")
    name = glob.escape(target.name)
    candidates = [
        *target.parent.glob(name + "*.shard-*-of-*"),
        *target.parent.glob("." + name + "*.shard-*-of-*.tmp"),
    ]
    found: dict[int, list[Path]] = {}
    for candidate in candidates:
        match = pattern.fullmatch(candidate.name)
        if match is not None:
            generation = match.group(1) or match.group(2) or 0
            found.setdefault(int(generation), []).append(candidate)
    return found


def next_generation(path: str | Path) -> int:
    """The generation a new save at `path` writes: one above every
    generation of shard files beside it, so it overwrites none of them."""
    return max(_generations(path), default=0) + 1


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
) -> None:
    """Write this process's replicas' files of save `generation` (process 0
    writes the index afterwards, once every process has: `write_index`).

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
        shard = Checkpoint(model, state.piece, state.steps, state.optimizer, {"owned": owned})
        save_checkpoint(targets[k], shard)


def write_index(
    path: str | Path,
    layout: ShardLayout,
    steps: int,
    model: dict[str, Any],
    extra: dict[str, Any],
    generation: int,
) -> None:
    """Process 0, once every shard of `generation` is written: the index at
    `path` (atomically), then the other generations' shard files go.

    Raises:
        CheckpointError, OSError: as `save_checkpoint` (the previous index
            and its shards are then untouched).
    """
    count = layout.replicas * layout.processes
    info = {"count": count, "n_params": layout.n_params, "generation": generation}
    index = Checkpoint(
        model, np.zeros(0, np.float32), steps, {}, {SHARDED_INDEX_KEY: info, **extra}
    )
    save_checkpoint(path, index)
    for older, files in _generations(path).items():
        if older != generation:
            for file in files:
                with contextlib.suppress(OSError):  # the save is done; a leftover is harmless
                    if file.is_file() and not file.is_symlink():
                        file.unlink()


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
            step, the shards' optimizer states differ in their entries or
            settings, or the shards do not tile the vector exactly once.
    """
    ckpt = load_checkpoint(path) if index is None else index
    info = ckpt.extra.get(SHARDED_INDEX_KEY)
    if info is None:
        return ckpt
    count, n, generation = _index_info(path, info)
    shards = [_load_shard(path, ckpt, g, count, generation) for g in range(count)]
    _check_same_optimizer(path, shards)
    if sum(int(shard.weights.shape[0]) for shard in shards) != n:  # before allocating n
        raise CheckpointError(f"the shards of {path} do not hold the index's {n} parameters")
    covered = np.zeros(n, dtype=np.int64)
    weights: np.ndarray | None = None
    optimizer: dict[str, Any] = {}
    for g, shard in enumerate(shards):
        weights = _place(shard, shard.weights, weights, n, covered, g)
        for key, value in shard.optimizer.items():
            if isinstance(value, np.ndarray):
                optimizer[key] = _place(shard, value, optimizer.get(key), n, None, g)
            else:
                optimizer[key] = value  # the same in every shard
    if weights is None or not (covered == 1).all():
        raise CheckpointError(f"the shards of {path} do not cover the parameters exactly once")
    extra = {k: v for k, v in ckpt.extra.items() if k != SHARDED_INDEX_KEY}
    return Checkpoint(ckpt.model, weights, ckpt.step, optimizer, extra)


def save_digest(path: str | Path, ckpt: Checkpoint) -> str:
    """Which save the checkpoint at `path` (read as `ckpt`) is, in hex: its
    own digest (`checkpoint_digest`), or for an index the SHA-256 of the
    index's digest and every shard file's, in order. An index names its
    shards only by count and generation, so byte-equal indexes (another
    run's save of the same step and generation, a copy beside stale shard
    files) can stand for other weights. Reads each file's last 32 bytes,
    not its contents (nor checks them: `merge_shards` does).

    Raises:
        OSError: a file cannot be read (a shard missing, say).
        CheckpointError: a bad index, or a file too short to be a checkpoint.
    """
    digest = checkpoint_digest(path)
    info = ckpt.extra.get(SHARDED_INDEX_KEY)
    if info is None:
        return digest
    count, _, generation = _index_info(path, info)
    sha = hashlib.sha256(bytes.fromhex(digest))
    for g in range(count):
        sha.update(bytes.fromhex(checkpoint_digest(shard_path(path, g, count, generation))))
    return sha.hexdigest()


def _check_same_optimizer(path: str | Path, shards: list[Checkpoint]) -> None:
    """Every shard's optimizer state has the same entries, each an array in
    every shard or the same setting in every shard (a shard missing a buffer
    would otherwise leave its positions zero in the merge).

    Raises:
        CheckpointError: naming the first shard and entry that differ.
    """
    first = shards[0].optimizer
    for g, shard in enumerate(shards[1:], start=1):
        state = shard.optimizer
        if state.keys() != first.keys():
            differ = sorted(state.keys() ^ first.keys())
            raise CheckpointError(f"shard {g} of {path}: optimizer entries differ: {differ}"[:300])
        for key, value in state.items():
            is_array = isinstance(value, np.ndarray)
            if is_array != isinstance(first[key], np.ndarray) or (
                not is_array and value != first[key]
            ):
                raise CheckpointError(
                    f"shard {g} of {path}: optimizer entry {key!r} differs from shard 0's"
                )


def _index_info(path: str | Path, info: Any) -> tuple[int, int, int]:
    """`(shard count, parameters, generation)` of an index, checked.

    Raises:
        CheckpointError: a field is missing, not an integer, or out of range.
    """
    try:
        count, n = int(info["count"]), int(info["n_params"])
        generation = int(info.get("generation", 0))
    except (AttributeError, KeyError, TypeError, ValueError, OverflowError) as exc:
        raise CheckpointError(f"{path}: a bad shard index: {exc!r}") from exc
    if count < 1 or n < 1 or generation < 0:
        raise CheckpointError(
            f"{path}: a bad shard index: {count} shards, {n} parameters, generation {generation}"
        )
    return count, n, generation


def _load_shard(
    path: str | Path, index: Checkpoint, g: int, count: int, generation: int
) -> Checkpoint:
    """Shard `g`, checked to be of the index's model and step.

    Raises:
        CheckpointError, OSError: as `load_checkpoint`; another model or step.
    """
    shard = load_checkpoint(shard_path(path, g, count, generation))
    if shard.model != index.model or shard.step != index.step:
        raise CheckpointError(f"shard {g} of {path} is of another model or step")
    return shard


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
