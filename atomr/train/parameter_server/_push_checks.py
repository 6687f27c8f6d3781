"""The checks a server shard runs on a push, a pull or an abort before it
touches anything: the worker's id, the version the worker pulled, and the
gradient's type, length, weight and finiteness in the shard's dtype
(`validation.cast_finite`: a float64 gradient of 1e39 is refused by a
float32 shard, with `NonFiniteError` as one holding NaN is; the sum of a
round is checked again where it is summed).

An id or a version is checked by the project's one rule for counts
(`atomr._arguments.int_at_least`: an int or a NumPy integer, not a bool) and
shown bounded (`bounded_repr`), but every refusal here is a ValueError, a
wrongly typed id too: the shard's handlers answer a bad message with
`Failure` (`_pull` and `_abort` catch ValueError only; a TypeError escaping
them would fail the shard, which is never restarted for bad input), and an
asker catching ValueError keeps getting it."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from atomr._arguments import int_at_least, real_number
from atomr._repr import bounded_repr
from atomr.actor.timers import check_delay
from atomr.train.core.errors import NonFiniteError
from atomr.train.core.validation import cast_finite
from atomr.train.parameter_server.messages import PushGradient

__all__ = ["check_push", "check_round_id", "check_staleness", "check_worker"]


def _count(name: str, value: Any) -> int:
    """`value` as an int >= 0 (`int_at_least`), a wrong type refused with
    ValueError too (module docstring).

    Raises:
        ValueError: not an int, or below 0 (the message names `name`).
    """
    try:
        return int_at_least(name, value, 0)
    except TypeError as exc:
        raise ValueError(str(exc)) from None


def check_worker(worker: Any, workers: int | None) -> int:
    """The worker's id as an int.

    Args:
        worker: the id sent.
        workers: how many workers the shard knows (None: any id >= 0).

    Raises:
        ValueError: not an int >= 0, or not a known worker.
    """
    index = _count("worker", worker)
    if workers is not None and index >= workers:
        raise ValueError(f"unknown worker {bounded_repr(index)}; this server has {workers} workers")
    return index


def check_round_id(round_id: Any) -> int | None:
    """The trainer round a push or abort names (`PushGradient.round_id`).

    Raises:
        ValueError: neither None nor an int >= 0.
    """
    if round_id is None:
        return None
    return _count("round_id", round_id)


def check_staleness(worker_version: Any, version: int) -> int:
    """The staleness `version - worker_version` of what a worker computed.

    Raises:
        ValueError: `worker_version` is not an int >= 0, or is ahead of `version`.
    """
    wv = _count("worker_version", worker_version)
    if wv > version:
        raise ValueError(
            f"worker_version {bounded_repr(wv)} is ahead of the server's version {version}"
        )
    return version - wv


def check_push(
    msg: PushGradient, n: int, workers: int | None, version: int, dtype: np.dtype
) -> tuple[int, np.ndarray, float, int]:
    """Everything of a push, its gradient checked finite in `dtype`.

    Args:
        msg: the push.
        n: how many weights the shard holds.
        workers: as for `check_worker`.
        version: the shard's version.
        dtype: the shard's dtype, which the gradient is applied in.

    Returns:
        `(worker, gradient, weight, staleness)`: the gradient cast to `dtype`
        (`msg.gradient` itself when it already is one, contiguous).

    Raises:
        TypeError: the gradient is not a float numpy array, or the weight
            or the hold not a real number.
        ValueError: a bad worker, version, round id, gradient length (never
            truncated or padded) or weight; a hold not > 0, or without a
            round id (its client confirms it by it).
        NonFiniteError: the gradient holds NaN or Inf, or values too large
            for `dtype` (`cast_finite`).
    """
    worker = check_worker(msg.worker, workers)
    round_id = check_round_id(msg.round_id)
    if msg.hold is not None:
        check_delay("hold", msg.hold, allow_zero=False)
        if round_id is None:
            raise ValueError("a held push needs a round_id: its client confirms it by it")
    staleness = check_staleness(msg.worker_version, version)
    grad = msg.gradient
    if not isinstance(grad, np.ndarray) or grad.dtype.kind != "f":
        raise TypeError("gradient must be a float numpy array")
    if grad.ndim != 1 or grad.shape[0] != n:
        raise ValueError(
            f"gradient has shape {grad.shape}, this server holds {n} weights "
            "(gradients are never truncated or padded)"
        )
    weight = real_number("weight", msg.weight)
    if not (math.isfinite(weight) and weight >= 0.0):
        raise ValueError(f"weight must be finite and >= 0, got {bounded_repr(msg.weight)}")
    return worker, cast_finite(grad, dtype, "gradients", NonFiniteError), weight, staleness
