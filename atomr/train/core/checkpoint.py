"""Checkpoint files: atomic, checksummed, pickle-free.

A checkpoint holds the model config, the flat weight vector, the step count,
the optimizer state and optional extra trainer state. Every trainer writes
and reads the same format, so a checkpoint from one loads into another for
the same model.

File layout (all integers little-endian)::

    b"ATOMRCK1"                 8 bytes, magic and format version
    header_len                  u64
    header                      UTF-8 JSON: model, step, scalar state, payload_len
    payload                     np.savez archive of every array (no pickles)
    sha256(everything above)    32 bytes

Saving writes a temporary file in the target's directory, fsyncs it,
`os.replace`s it over the target and fsyncs the directory: a crash at any
point leaves either the previous checkpoint or the new one, never a mix
(`_atomic_write`). Loading trusts nothing in the file: its frame (each
length against the file's size, before what it counts is read, and the
checksum) is checked in `_checkpoint_frame`, its kind, header and numbers
in `_checkpoint_validation`, its arrays in `_checkpoint_members`.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from atomr.train.core._atomic_write import check_target, probe_write, write_atomically
from atomr.train.core._checkpoint_frame import LENGTH, MAGIC, checkpoint_digest, read_frame
from atomr.train.core._checkpoint_members import read_members
from atomr.train.core._checkpoint_validation import check_count, check_header, model_difference
from atomr.train.core._shard_files import remove_shard_files
from atomr.train.core.errors import CheckpointError
from atomr.train.core.optimizer import Optimizer, OptimizerKind

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "check_model_matches",
    "check_save_location",
    "check_save_target",
    "check_optimizer_state",
    "checkpoint_digest",
    "extra_count",
    "pending_micro_steps",
    "load_checkpoint",
    "probe_write",
    "save_checkpoint",
]


SHARDED_INDEX_KEY = "sharded"
"""The `extra` key that marks the index of a checkpoint saved one file per
replica (written by `atomr.train.sharded.checkpoints`, read by
`atomr.train.core.sharded_index`)."""


@dataclass
class Checkpoint:
    """The content of a checkpoint file.

    Attributes:
        model: the model's config (`Mlp.config()`: sizes, activation, ...).
        weights: the flat weight vector (`Mlp.params` layout), in the
            model's dtype.
        step: number of optimizer steps applied so far.
        optimizer: the optimizer's `state_dict()`: ndarray values are stored
            as arrays, everything else must be JSON-serialisable.
        extra: further trainer state, same rules as `optimizer`.
    """

    model: dict[str, Any]
    weights: np.ndarray
    step: int
    optimizer: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


def _check_storable(what: str, value: np.ndarray) -> np.ndarray:
    """Return `value`, or raise CheckpointError if it needs a pickle to store."""
    if value.dtype.hasobject:
        raise CheckpointError(f"{what} is an object array (no pickles)")
    return value


def _split(section: str, state: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    scalars: dict[str, Any] = {}
    arrays: dict[str, np.ndarray] = {}
    for key, value in state.items():
        if "/" in key:
            raise CheckpointError(f"{section} key {key!r} may not contain '/'")
        if isinstance(value, np.ndarray):
            arrays[f"{section}/{key}"] = _check_storable(f"{section}[{key!r}]", value)
        else:
            scalars[key] = value
    return scalars, arrays


def _encode(ckpt: Checkpoint) -> bytes:
    opt_scalars, opt_arrays = _split("optimizer", ckpt.optimizer)
    extra_scalars, extra_arrays = _split("extra", ckpt.extra)
    weights = _check_storable("weights", np.ascontiguousarray(ckpt.weights))
    arrays = {"weights": weights, **opt_arrays, **extra_arrays}
    buf = io.BytesIO()
    np.savez(buf, allow_pickle=False, **arrays)
    payload = buf.getvalue()
    try:
        header = json.dumps(
            {
                "model": ckpt.model,
                "step": int(ckpt.step),
                "optimizer": opt_scalars,
                "extra": extra_scalars,
                "payload_len": len(payload),
            },
            sort_keys=True,
            allow_nan=True,
        ).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"checkpoint state is not JSON-serialisable: {exc}") from exc
    body = MAGIC + LENGTH.pack(len(header)) + header + payload
    return body + hashlib.sha256(body).digest()


def save_checkpoint(path: str | os.PathLike[str], ckpt: Checkpoint) -> None:
    """Write `ckpt` to `path` atomically and durably.

    Args:
        path: destination file; its directory must exist. An existing file is
            replaced only once the new one is complete and fsynced; then,
            unless `ckpt` is an index, the shard files of an index it
            replaced go (`remove_shard_files`).
        ckpt: what to write.

    Raises:
        CheckpointError: the state holds something that cannot be stored
            without pickles (object arrays, non-JSON scalars).
        FileNotFoundError: the directory of `path` does not exist (its
            `filename` is that directory).
        NotADirectoryError: that directory is a file (`filename` names it).
        CheckpointError: `path` exists and is not a regular file (a symlink,
            device, FIFO or directory is never replaced).
        OSError: the file system refused (the previous checkpoint, if any, is
            left intact and no temporary file remains).
    """
    write_atomically(Path(path), _encode(ckpt))
    if SHARDED_INDEX_KEY not in ckpt.extra:  # an index's writer keeps its own generation
        remove_shard_files(path)


def check_save_target(path: str | os.PathLike[str]) -> None:
    """What `save_checkpoint(path, ...)` refuses about `path` itself, checked
    before anything is written (a save of several files checks every one
    first, so a refused save leaves none behind).

    Raises:
        FileNotFoundError: the directory of `path` does not exist.
        NotADirectoryError: it is a file.
        CheckpointError: `path` exists and is not a regular file.
    """
    check_target(Path(path))


def check_save_location(path: str | os.PathLike[str]) -> None:
    """`check_save_target`, and a real test write in the folder of `path`
    (`probe_write`): for a run that saves only after long work (`fit`), so a
    folder it cannot write in is refused before that work, not after it.

    Raises:
        FileNotFoundError: the directory of `path` does not exist.
        NotADirectoryError: it is a file.
        CheckpointError: `path` exists and is not a regular file.
        OSError: a file cannot be written in that directory (no permission,
            a read-only or full file system); a note says the test write failed.
    """
    directory = check_target(Path(path))
    try:
        probe_write(directory)
    except OSError as exc:
        exc.add_note(f"a test write for the checkpoint {path} failed in {directory}")
        raise


def load_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """Read and verify a checkpoint written by `save_checkpoint`.

    The file is untrusted: a valid checksum proves integrity, not intent. Only
    a regular file is read (a FIFO or device is refused without blocking);
    only uncompressed `.npy` members of the names this format writes are
    accepted, and each one's dtype and shape are checked against its size
    before it is read. Every array must hold finite real numbers (in the
    dtype it was saved in: a float64 model's weights of 1e39 load), and the
    optimizer's scalars (hyper-parameters) must be finite in float64; a
    trainer checks both in its model's dtype (`check_model_matches` refuses
    weights wider than it, `check_optimizer_state` the optimizer's scalars
    and buffers); no integer in the header may be beyond float's range
    (10**400 is valid JSON).

    Args:
        path: the checkpoint file.

    Returns:
        The `Checkpoint`.

    Raises:
        FileNotFoundError: `path` does not exist.
        CheckpointError: not a regular file, not a checkpoint, truncated,
            larger than its header says (trailing bytes), a payload larger
            than this machine's memory, checksum mismatch, or a malformed
            field (the message names it).
    """
    where = os.fspath(path)
    decoded, payload = read_frame(where)
    try:
        header = check_header(decoded, len(payload))
        arrays = read_members(payload)
        return _assemble(header, arrays)
    except CheckpointError as exc:
        raise CheckpointError(f"{where}: {exc}") from exc


def _assemble(header: dict[str, Any], arrays: dict[str, np.ndarray]) -> Checkpoint:
    """The Checkpoint from a checked header and checked arrays."""
    weights = arrays.get("weights")
    if weights is None or weights.ndim != 1 or weights.dtype.kind != "f":
        shown = "missing" if weights is None else f"{weights.dtype} {weights.shape}"
        raise CheckpointError(f"weights must be a 1-D float array, got {shown}")
    optimizer: dict[str, Any] = dict(header["optimizer"])
    extra: dict[str, Any] = dict(header["extra"])
    for name, value in arrays.items():
        section, _, key = name.partition("/")
        target = optimizer if section == "optimizer" else extra if section == "extra" else None
        if target is not None:
            if key in target:
                raise CheckpointError(f"{section}[{key!r}] is both a scalar and an array")
            target[key] = value
    return Checkpoint(
        model=header["model"],
        weights=weights,
        step=header["step"],
        optimizer=optimizer,
        extra=extra,
    )


def check_model_matches(
    ckpt: Checkpoint, model_config: Mapping[str, Any], n_params: int, dtype: Any
) -> None:
    """Check that a checkpoint was made for the given model.

    Args:
        ckpt: a loaded checkpoint.
        model_config: the receiving model's `config()`.
        n_params: the receiving model's parameter count.
        dtype: the dtype the receiving model holds its weights in (not read
            from `model_config`, which may name none: a parameter server's
            default config).

    Raises:
        CheckpointError: sizes, activation, `activate_last` (absent, as in a
            checkpoint older than it: False), layers, input shape or kind, or
            parameter count differ, the weights are not real numbers or are
            wider floats than `dtype` (loading would round them),
            or `ckpt` is the index of a sharded save, not merged (`merge_shards`).
    """
    if SHARDED_INDEX_KEY in ckpt.extra:
        raise CheckpointError(
            "this is the index of a checkpoint saved one file per replica, not its "
            "content: read it with merge_shards (atomr.train.sharded), as every "
            "trainer's LoadCheckpoint does"
        )
    difference = model_difference(ckpt.model, model_config)
    if difference is not None:
        raise CheckpointError(difference)
    if ckpt.weights.ndim != 1 or ckpt.weights.shape[0] != n_params:
        raise CheckpointError(
            f"checkpoint holds {ckpt.weights.shape} weights, this model has {n_params} parameters"
        )
    if ckpt.weights.dtype.kind not in "fiu":
        raise CheckpointError(
            f"checkpoint weights have dtype {ckpt.weights.dtype}, not a real number"
        )
    _check_no_rounding(ckpt.weights.dtype, np.dtype(dtype))


def _check_no_rounding(saved: np.dtype[Any], receiving: np.dtype[Any]) -> None:
    """Loading float weights into a narrower float model would round them."""
    if saved.kind == "f" and receiving.itemsize < saved.itemsize:
        raise CheckpointError(
            f"checkpoint weights are {saved}, this model is {receiving}: loading would round "
            f"them. Build the model with dtype={saved}, or cast the checkpoint on purpose "
            "(load_checkpoint, weights.astype, save_checkpoint)"
        )


def extra_count(ckpt: Checkpoint, key: str) -> int:
    """`ckpt.extra[key]` (default 0), checked to be a count.

    Raises:
        CheckpointError: not an integer from 0 to `INDEX_MAX` (a bool, a
            float or a string included; `check_count`).
    """
    value = ckpt.extra.get(key, 0)
    if isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "iu":
        value = int(value)
    return check_count(f"extra.{key}", value)


def pending_micro_steps(ckpt: Checkpoint) -> int:
    """How many micro-steps into a gradient accumulation the checkpoint was saved.

    Raises:
        CheckpointError: `extra["micro"]` is not a count (`extra_count`).
    """
    return extra_count(ckpt, "micro")


def restored_optimizer(
    kind: OptimizerKind,
    n_params: int,
    state: Mapping[str, Any],
    backend: Any = None,
    dtype: Any = np.float32,
    owner: str = "checkpoint",
) -> Optimizer:
    """A new `kind` optimizer over `n_params` parameters holding the saved `state`.

    The caller swaps it in only once everything else of the checkpoint is
    checked, so a state that does not fit changes nothing.

    Args:
        backend, dtype: as `OptimizerKind.create`.
        owner: who restores it, first in the error message.

    Raises:
        CheckpointError: another optimizer kind, or state that is missing,
            malformed, of the wrong shape or out of range in `dtype` (a
            buffer of 1e39 fits float64, not float32).
    """
    fresh = kind.create(n_params, backend, dtype)
    try:
        fresh.load_state_dict(state)  # type: ignore[arg-type]
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{owner}: optimizer state does not fit: {exc}") from exc
    return fresh


def check_optimizer_state(ckpt: Checkpoint, kind: OptimizerKind, n_params: int, dtype: Any) -> None:
    """Check that the checkpoint's optimizer state loads into `kind` over
    `n_params` parameters of `dtype` (the receiving model's: hyperparameters
    are checked in it), into a throwaway host optimizer: nothing changes.

    Raises:
        CheckpointError: as `restored_optimizer`.
    """
    restored_optimizer(kind, n_params, ckpt.optimizer, dtype=dtype)
