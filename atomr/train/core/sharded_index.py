"""Reading a checkpoint saved one file per replica: the index at the path
and its shard files, merged into one full `Checkpoint`.

A sharded trainer with `ShardedOptions.shard_checkpoints` writes each
replica's state to a file of its own, `<path>.gen-<N>.shard-<g>-of-<G>`,
and at the path an *index*: a checkpoint whose weights are empty and whose
`extra["sharded"]` gives the shard count, the parameter count, the
generation `N` and the save's id, a random token that every shard file of
the save holds too (writing them: `atomr.train.sharded.checkpoints`): a
shard file of another save of the same step and generation (another run's,
copied beside this index) is refused, not merged. Indexes from before save
ids (no `save` field) load as they did, trusting the shard files' names. Every
trainer's `LoadCheckpoint` reads its path with `merge_shards`, so such a
save loads into any trainer, layout and replica count, as a full checkpoint
does.
"""

from __future__ import annotations

import hashlib
import os
import re
from typing import Any

import numpy as np

from atomr._repr import bounded_repr
from atomr.train.core._checkpoint_validation import check_count
from atomr.train.core._shard_files import shard_path
from atomr.train.core.checkpoint import (
    SHARDED_INDEX_KEY,
    Checkpoint,
    CheckpointError,
    checkpoint_digest,
    load_checkpoint,
)

__all__ = ["merge_shards", "save_digest", "shard_path"]

_SAVE_ID = re.compile(r"[0-9a-f]{32}")


def merge_shards(path: str | os.PathLike[str], index: Checkpoint | None = None) -> Checkpoint:
    """The full checkpoint at `path`: what every trainer's `LoadCheckpoint`
    reads.

    Args:
        path: a checkpoint file: the index of a save of one file per
            replica (its shard files beside it), or a full checkpoint.
        index: the file at `path`, when already read.

    Returns:
        A `Checkpoint` in the full format; a checkpoint that is not an
        index is returned as it is.

    Raises:
        FileNotFoundError, OSError, CheckpointError: as `load_checkpoint`,
            for the file or any of its shard files.
        CheckpointError: a shard is missing, unreadable, of another model,
            step or save (its save id is not the index's), the shards' optimizer states differ in their entries or
            settings, or the shards do not tile the vector exactly once.
    """
    ckpt = load_checkpoint(path) if index is None else index
    info = ckpt.extra.get(SHARDED_INDEX_KEY)
    if info is None:
        return ckpt
    count, n, generation, save = _index_info(path, info)
    shards = [_load_shard(path, ckpt, g, (count, generation, save)) for g in range(count)]
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


def save_digest(path: str | os.PathLike[str], ckpt: Checkpoint) -> str:
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
    count, _, generation, _ = _index_info(path, info)
    sha = hashlib.sha256(bytes.fromhex(digest))
    for g in range(count):
        sha.update(bytes.fromhex(checkpoint_digest(shard_path(path, g, count, generation))))
    return sha.hexdigest()


def _check_same_optimizer(path: str | os.PathLike[str], shards: list[Checkpoint]) -> None:
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


def _index_info(path: str | os.PathLike[str], info: Any) -> tuple[int, int, int, str | None]:
    """`(shard count, parameters, generation, save id)` of an index, checked
    (the save id None in an index from before save ids): each number a
    count by the one rule of sizes (`check_count`: an int as JSON gives it,
    not a bool, a float or a string, which `int()` would round or parse).

    Raises:
        CheckpointError: not an object, a field missing, not an integer or
            out of range (the message names it), or a save id that is not
            32 lowercase hex digits.
    """
    if not isinstance(info, dict):
        raise CheckpointError(f"{path}: a bad shard index: {bounded_repr(info)}, not an object")
    try:
        count = check_count("count", info.get("count"))
        n = check_count("n_params", info.get("n_params"))
        generation = check_count("generation", info.get("generation", 0))
    except CheckpointError as exc:
        raise CheckpointError(f"{path}: a bad shard index: {exc}") from None
    save = info.get("save")
    if save is not None and not (isinstance(save, str) and _SAVE_ID.fullmatch(save)):
        raise CheckpointError(
            f"{path}: a bad shard index: save id {bounded_repr(save)} is not 32 hex digits"
        )
    if count < 1 or n < 1:
        raise CheckpointError(
            f"{path}: a bad shard index: {count} shards, {n} parameters, generation {generation}"
        )
    return count, n, generation, save


def _load_shard(
    path: str | os.PathLike[str], index: Checkpoint, g: int, save: tuple[int, int, str | None]
) -> Checkpoint:
    """Shard `g` of the save `(count, generation, save id)`, checked to be
    of the index's model, step and save id (none in an index and shards
    from before save ids).

    Raises:
        CheckpointError, OSError: as `load_checkpoint`; another model, step
            or save.
    """
    count, generation, save_id = save
    shard = load_checkpoint(shard_path(path, g, count, generation))
    if shard.model != index.model or shard.step != index.step:
        raise CheckpointError(f"shard {g} of {path} is of another model or step")
    if shard.extra.get("save") != save_id:
        raise CheckpointError(
            f"shard {g} of {path} is of another save (save id "
            f"{bounded_repr(shard.extra.get('save'))}, the index's {save_id!r}): the shard "
            "files of two saves of one step and generation are mixed"
        )
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
        ranges = [(check_count("lo", lo), check_count("hi", hi)) for lo, hi in shard.extra["owned"]]
    except (KeyError, TypeError, ValueError, CheckpointError) as exc:
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
