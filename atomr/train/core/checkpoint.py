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
point leaves either the previous checkpoint or the new one, never a mix.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import struct
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from atomr.train.core.errors import CheckpointError

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "check_model_matches",
    "load_checkpoint",
    "save_checkpoint",
]

MAGIC = b"ATOMRCK1"
_DIGEST = 32
_LEN = struct.Struct("<Q")


@dataclass
class Checkpoint:
    """The content of a checkpoint file.

    Attributes:
        model: the model's config (`Mlp.config()`: sizes, activation, ...).
        weights: the flat float32 weight vector (`Mlp.params` layout).
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
    body = MAGIC + _LEN.pack(len(header)) + header + payload
    return body + hashlib.sha256(body).digest()


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def save_checkpoint(path: str | os.PathLike[str], ckpt: Checkpoint) -> None:
    """Write `ckpt` to `path` atomically and durably.

    Args:
        path: destination file; its directory must exist. An existing file is
            replaced only once the new one is complete and fsynced.
        ckpt: what to write.

    Raises:
        CheckpointError: the state holds something that cannot be stored
            without pickles (object arrays, non-JSON scalars).
        FileNotFoundError: the directory of `path` does not exist (its
            `filename` is that directory).
        OSError: the file system refused (the previous checkpoint, if any, is
            left intact and no temporary file remains).
    """
    target = Path(path)
    data = _encode(ckpt)
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise FileNotFoundError(
            errno.ENOENT, "checkpoint directory does not exist", os.fspath(directory)
        )
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise
    _fsync_dir(directory)


def load_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """Read and verify a checkpoint written by `save_checkpoint`.

    Args:
        path: the checkpoint file.

    Returns:
        The `Checkpoint`.

    Raises:
        FileNotFoundError: `path` does not exist.
        CheckpointError: not a checkpoint, truncated, checksum mismatch, or
            malformed content.
    """
    raw = Path(path).read_bytes()
    where = os.fspath(path)
    min_len = len(MAGIC) + _LEN.size + _DIGEST
    if len(raw) < min_len or raw[: len(MAGIC)] != MAGIC:
        raise CheckpointError(f"{where}: not an atomr checkpoint (bad magic or truncated)")
    body, digest = raw[:-_DIGEST], raw[-_DIGEST:]
    if hashlib.sha256(body).digest() != digest:
        raise CheckpointError(f"{where}: checksum mismatch (file corrupted or truncated)")
    (header_len,) = _LEN.unpack_from(body, len(MAGIC))
    start = len(MAGIC) + _LEN.size
    try:
        header = json.loads(body[start : start + header_len].decode("utf-8"))
        payload = body[start + header_len :]
        if len(payload) != header["payload_len"]:
            raise CheckpointError(f"{where}: payload length mismatch")
        with np.load(io.BytesIO(payload), allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
        optimizer: dict[str, Any] = dict(header["optimizer"])
        extra: dict[str, Any] = dict(header["extra"])
        for name, value in arrays.items():
            section, _, key = name.partition("/")
            if section == "optimizer":
                optimizer[key] = value
            elif section == "extra":
                extra[key] = value
        return Checkpoint(
            model=dict(header["model"]),
            weights=arrays["weights"],
            step=int(header["step"]),
            optimizer=optimizer,
            extra=extra,
        )
    except CheckpointError:
        raise
    except Exception as exc:
        raise CheckpointError(f"{where}: malformed checkpoint: {exc}") from exc


def check_model_matches(ckpt: Checkpoint, model_config: Mapping[str, Any], n_params: int) -> None:
    """Check that a checkpoint was made for the given model.

    Args:
        ckpt: a loaded checkpoint.
        model_config: the receiving model's `Mlp.config()`.
        n_params: the receiving model's parameter count.

    Raises:
        CheckpointError: sizes, activation or parameter count differ, or the
            weights are not real numbers.
    """
    mine = {k: model_config.get(k) for k in ("sizes", "activation")}
    theirs = {k: ckpt.model.get(k) for k in ("sizes", "activation")}
    if mine != theirs:
        raise CheckpointError(f"checkpoint is for model {theirs}, this model is {mine}")
    if ckpt.weights.ndim != 1 or ckpt.weights.shape[0] != n_params:
        raise CheckpointError(
            f"checkpoint holds {ckpt.weights.shape} weights, this model has {n_params} parameters"
        )
    if ckpt.weights.dtype.kind not in "fiu":
        raise CheckpointError(
            f"checkpoint weights have dtype {ckpt.weights.dtype}, not a real number"
        )
