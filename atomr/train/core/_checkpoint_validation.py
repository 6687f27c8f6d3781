"""Validation of a checkpoint file being loaded: its kind, its header, the
range of its numbers, and whether its model is the receiving one.

The file is untrusted (`load_checkpoint`): only a regular file is read, the
header's JSON is checked field by field, no number in it may be beyond
float's range (JSON allows an integer such as 10**400, which every reader
that takes it as a float overflows), and every number of the optimizer's
must be finite in float64 (NaN, infinity and 10**400 are wrong in every
dtype). Its hyperparameters are checked where they are used, in the
receiving model's dtype, when a trainer
loads the state (`check_optimizer_state`: `lr=1e39` loads into a float64
model, not into a float32 one). The arrays' own checks are in
`_checkpoint_members`.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator, Mapping
from typing import Any, BinaryIO

import numpy as np

from atomr._arguments import int_at_least
from atomr.actor.errors import bounded_repr
from atomr.train.core.errors import CheckpointError

__all__ = [
    "check_count",
    "check_finite_numbers",
    "check_float_numbers",
    "check_header",
    "model_difference",
    "open_regular_file",
]

_F64_MAX = float(np.finfo(np.float64).max)
_MAX_DEPTH = 32
"""How deep a header's objects and lists may nest (a model's or schedule's
config nests a few levels)."""


def open_regular_file(where: str) -> BinaryIO:
    """`where` opened for reading, which must be a regular file (symlinks
    followed). Opened non-blocking, so a FIFO is refused instead of waited on.

    Raises:
        FileNotFoundError: `where` does not exist (OSError: it cannot be opened).
        CheckpointError: not a regular file.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(where, flags)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise CheckpointError(f"{where}: a directory, not a checkpoint file")
        if not stat.S_ISREG(mode):
            raise CheckpointError(f"{where}: not a regular file (a device, FIFO or socket)")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def check_header(header: object, payload_len: int) -> dict[str, Any]:
    """The header's decoded JSON (`read_frame`), with every field's type and
    range checked.

    Raises:
        CheckpointError: not a JSON object, nested deeper than 32 levels,
            or a field missing, of the wrong type or out of range (the
            message names it).
    """
    if not isinstance(header, dict):
        raise CheckpointError("header is not a JSON object")
    _check_depth(header)
    for key in ("model", "optimizer", "extra"):
        if not isinstance(header.get(key), dict):
            raise CheckpointError(f"header field {key!r} is missing or not an object")
    check_count("step", header.get("step"))
    if header.get("payload_len") != payload_len or isinstance(header["payload_len"], bool):
        raise CheckpointError(f"payload_len {header.get('payload_len')!r} != {payload_len}")
    if "step" in header["optimizer"]:
        check_count("optimizer.step", header["optimizer"]["step"])
    check_finite_numbers("optimizer", header["optimizer"])
    for key in ("model", "extra"):
        check_float_numbers(key, header[key])
    return header


def _check_depth(header: dict[str, Any]) -> None:
    """Raise CheckpointError naming the first field nested deeper than
    `_MAX_DEPTH` (JSON's reader allows about 1000 levels, beyond what the
    code that compares, describes or rebuilds a config recurses through)."""
    pending: list[tuple[str, object, int]] = [("header", header, 0)]
    while pending:
        where, item, depth = pending.pop()
        if depth > _MAX_DEPTH:
            raise CheckpointError(f"{where[:200]}... nests deeper than {_MAX_DEPTH} levels")
        if isinstance(item, dict):
            pending.extend((f"{where}.{key}", inner, depth + 1) for key, inner in item.items())
        elif isinstance(item, list):
            pending.extend((f"{where}[{i}]", inner, depth + 1) for i, inner in enumerate(item))


def check_count(what: str, value: object) -> int:
    """`value`, checked to be a count by the project's one rule of sizes
    (`atomr._arguments.int_at_least`): an int, not a bool, from 0 to
    `INDEX_MAX`.

    Raises:
        CheckpointError: anything else (the message names `what`, and the
            limit for one beyond it).
    """
    try:
        return int_at_least(what, value, 0)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(str(exc)) from None


def _numbers(what: str, value: object) -> Iterator[tuple[str, int | float]]:
    """Every number inside `value` (dicts and lists walked, without recursion:
    a header may nest as deep as JSON's reader allows), with its field's name."""
    pending: list[tuple[str, object]] = [(what, value)]
    while pending:
        where, item = pending.pop()
        if isinstance(item, dict):
            pending.extend((f"{where}.{key}", inner) for key, inner in reversed(item.items()))
        elif isinstance(item, list):
            pending.extend((f"{where}[{i}]", inner) for i, inner in reversed(list(enumerate(item))))
        elif isinstance(item, int | float) and not isinstance(item, bool):
            yield where, item


def check_finite_numbers(what: str, value: object) -> None:
    """Raise CheckpointError naming the field of any number inside `value`
    (an int included) that is not finite in float64."""
    for where, number in _numbers(what, value):
        if not abs(number) <= _F64_MAX:  # exact for an int of any size, False for NaN
            raise CheckpointError(f"{where} = {bounded_repr(number)} is not finite in float64")


def check_float_numbers(what: str, value: object) -> None:
    """Raise CheckpointError naming the field of any integer inside `value`
    that is beyond float's range (no float holds it)."""
    for where, number in _numbers(what, value):
        if isinstance(number, int) and abs(number) > _F64_MAX:
            raise CheckpointError(f"{where} = {bounded_repr(number)} is beyond float's range")


_MODEL_KEYS = ("sizes", "activation", "activate_last", "layers", "input_shape", "input_kind")
"""The keys of a model config that decide which function its weights compute."""


def model_difference(saved: Mapping[str, Any], receiving: Mapping[str, Any]) -> str | None:
    """What differs between a checkpoint's model config and the receiving
    model's, shortly; None when they describe the same model (`_MODEL_KEYS`;
    `activate_last` absent, as in a checkpoint older than it, is False)."""
    theirs, mine = _identity(saved), _identity(receiving)
    if theirs == mine:
        return None
    for key in _MODEL_KEYS:
        a, b = theirs.get(key), mine.get(key)
        if a == b:
            continue
        if key == "activate_last":
            flags = bounded_repr(theirs.get(key, False)), bounded_repr(mine.get(key, False))
            return (
                f"checkpoint is for a model with activate_last={flags[0]}, "
                f"this model has activate_last={flags[1]}"
            )
        if key == "layers" and isinstance(a, list) and isinstance(b, list):
            for i, (la, lb) in enumerate(zip(a, b, strict=False)):
                if la != lb:
                    return f"checkpoint is for another model: its layer {i} is {la}, this model's is {lb}"[
                        :500
                    ]
            return f"checkpoint is for another model: {len(a)} layers, this model has {len(b)}"
        return f"checkpoint is for model {theirs}, this model is {mine}"[:500]
    return "checkpoint is for another model"


def _identity(config: Mapping[str, Any]) -> dict[str, Any]:
    """`config`'s `_MODEL_KEYS` that are set, `activate_last` only when not
    False (its default)."""
    found = {k: config.get(k) for k in _MODEL_KEYS if config.get(k) is not None}
    if found.get("activate_last") is False:
        del found["activate_last"]
    return found
