"""The checks a server shard runs on a push, a pull or an abort before it
touches anything: the worker's id, the version the worker pulled, and the
gradient's type, length and weight (finiteness is checked where the gradient
is summed)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from atomr.train.parameter_server.messages import PushGradient

__all__ = ["check_push", "check_round_id", "check_staleness", "check_worker"]


def check_worker(worker: Any, workers: int | None) -> int:
    """The worker's id as an int.

    Args:
        worker: the id sent.
        workers: how many workers the shard knows (None: any id >= 0).

    Raises:
        ValueError: not an int >= 0, or not a known worker.
    """
    if isinstance(worker, bool) or not isinstance(worker, (int, np.integer)) or worker < 0:
        raise ValueError(f"worker must be an int >= 0, got {worker!r}")
    if workers is not None and worker >= workers:
        raise ValueError(f"unknown worker {worker}; this server has {workers} workers")
    return int(worker)


def check_round_id(round_id: Any) -> int | None:
    """The trainer round a push or abort names (`PushGradient.round_id`).

    Raises:
        ValueError: neither None nor an int >= 0.
    """
    if round_id is None:
        return None
    if isinstance(round_id, bool) or not isinstance(round_id, (int, np.integer)) or round_id < 0:
        raise ValueError(f"round_id must be None or an int >= 0, got {round_id!r}")
    return int(round_id)


def check_staleness(worker_version: Any, version: int) -> int:
    """The staleness `version - worker_version` of what a worker computed.

    Raises:
        ValueError: `worker_version` is not an int >= 0, or is ahead of `version`.
    """
    wv = worker_version
    if isinstance(wv, bool) or not isinstance(wv, (int, np.integer)) or wv < 0:
        raise ValueError(f"worker_version must be an int >= 0, got {wv!r}")
    if wv > version:
        raise ValueError(f"worker_version {wv} is ahead of the server's version {version}")
    return version - int(wv)


def check_push(
    msg: PushGradient, n: int, workers: int | None, version: int
) -> tuple[int, np.ndarray, float, int]:
    """Everything of a push but finiteness.

    Args:
        msg: the push.
        n: how many weights the shard holds.
        workers: as for `check_worker`.
        version: the shard's version.

    Returns:
        `(worker, gradient, weight, staleness)`.

    Raises:
        TypeError: the gradient is not a float numpy array.
        ValueError: a bad worker, version, round id, gradient length (never
            truncated or padded) or weight.
    """
    worker = check_worker(msg.worker, workers)
    check_round_id(msg.round_id)
    staleness = check_staleness(msg.worker_version, version)
    grad = msg.gradient
    if not isinstance(grad, np.ndarray) or grad.dtype.kind != "f":
        raise TypeError("gradient must be a float numpy array")
    if grad.ndim != 1 or grad.shape[0] != n:
        raise ValueError(
            f"gradient has shape {grad.shape}, this server holds {n} weights "
            "(gradients are never truncated or padded)"
        )
    weight = float(msg.weight)
    if not (math.isfinite(weight) and weight >= 0.0):
        raise ValueError(f"weight must be finite and >= 0, got {msg.weight!r}")
    return worker, grad, weight, staleness
