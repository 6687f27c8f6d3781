"""`check_memory`: refuse a run whose sizes cannot fit, before allocating.

The estimate is a lower bound of the peak host memory: parameters, their
gradients and the optimizer's state per replica, the activations of a
training step and of the whole-set evaluation after each epoch, and the
data set (with the float64 temporaries of the synthetic generator). A run
that needs more than the memory available now is refused in one line.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from atomr.cli.errors import CliError
from atomr.cli.model_options import GptShape
from atomr.cli.run_config import RunConfig
from atomr.cli.strategies import STRATEGIES

__all__ = ["MemoryEstimate", "available_memory", "check_memory", "estimate_memory"]

_F32 = 4
_DIGITS = (1797, 64, 10)  # samples, features, classes of the bundled digits set
_SYNTHETIC_BYTES_PER_VALUE = 3 * 8 + _F32  # two float64 temporaries, their sum, the float32 copy
_LABEL_BYTES = 8


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes a run needs at its peak, by kind (see `estimate_memory`)."""

    parameters: int
    optimizer: int
    activations: int
    data: int

    @property
    def total(self) -> int:
        """The sum of the parts."""
        return self.parameters + self.optimizer + self.activations + self.data


def estimate_memory(run: RunConfig) -> MemoryEstimate:
    """The peak memory of `run`, by kind (float32 model, host devices).

    Returns:
        parameters: weights and gradients of every replica, and the
        initial model built by the command; optimizer: the
        moments (Adam: two, SGD with momentum: one) of every replica;
        activations: forward and backward values of a step (of
        `--batch-size` samples, or all of them when fewer) and of the
        evaluation of the training set; data: the data set while generated.
        A GPT's counts leave out what its text decides (the vocabulary's
        rows, the windows), which is read only after this check.
    """
    if run.gpt is not None:
        params, per_sample = _gpt_sizes(run.gpt)
        samples, data = 0, 0
    else:
        samples, features, classes = (
            _DIGITS if run.dataset == "digits" else (run.samples, run.features, run.classes)
        )
        sizes = [features, *run.hidden, classes]
        params = sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:], strict=True))
        per_sample = sum(sizes[1:])
        per_value = _SYNTHETIC_BYTES_PER_VALUE if run.dataset == "synthetic" else _F32
        data = samples * (features * per_value + _LABEL_BYTES)
    moments = 2 if run.optimizer in ("adam", "adamw") else (1 if run.momentum > 0 else 0)
    replicas = STRATEGIES[run.strategy].replicas(run)
    return MemoryEstimate(
        parameters=_F32 * params * (2 * replicas + 1),
        optimizer=moments * _F32 * params * replicas,
        activations=2 * _F32 * per_sample * (_step_batch(run, samples) + samples),
        data=data,
    )


def _step_batch(run: RunConfig, samples: int) -> int:
    """The samples of one step: `--batch-size`, but no more than the data
    holds (a GPT's windows are counted only later: its `--batch-size`)."""
    return run.batch_size if run.gpt is not None else min(run.batch_size, samples)


def _gpt_sizes(shape: GptShape) -> tuple[int, int]:
    """A GPT's parameters without its vocabulary's rows (embedding and
    output), and the values one sample's step keeps per block (the
    residual stream, attention's projections and scores, the MLP's 4x)."""
    d, context = shape.d_model, shape.context
    params = shape.n_layer * (12 * d * d + 13 * d) + context * d + 2 * d
    per_token = shape.n_layer * (12 * d + shape.n_head * context) + d
    return params, context * per_token


def _cgroup_headroom() -> int | None:
    """What the cgroup (v2) still lets this process allocate, or None without a limit."""
    base = Path("/sys/fs/cgroup")
    try:
        limit = (base / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return int(limit) - int((base / "memory.current").read_text().strip())
    except (OSError, ValueError):
        return None


def available_memory() -> int | None:
    """Bytes of memory available now (the smaller of the system's
    `MemAvailable` and the cgroup's headroom), or None where unknown."""
    found: list[int] = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        with contextlib.suppress(AttributeError, OSError, ValueError):
            found.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    headroom = _cgroup_headroom()
    if headroom is not None:
        found.append(headroom)
    return min(found) if found else None


def _smaller(run: RunConfig) -> str:
    """What to change for a smaller run."""
    if run.gpt is not None:
        return "reduce --d-model, --n-layer, --context or --batch-size, or use fewer --devices"
    return "reduce --hidden, --samples or --features, or use fewer --devices"


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB"


def check_memory(run: RunConfig, available: int | None = None) -> None:
    """Refuse `run` when its estimated peak exceeds the memory available.

    Args:
        run: the options.
        available: bytes available; None: measured now (`available_memory`).

    Raises:
        CliError: one line with the estimate by kind (exit status 1).
    """
    if any(d.is_cuda for d in run.devices):
        return  # the model lives in GPU memory: the trainers report what does not fit
    free = available if available is not None else available_memory()
    need = estimate_memory(run)
    if free is None or need.total <= free:
        return
    raise CliError(
        f"this run needs about {_gib(need.total)} of memory (parameters {_gib(need.parameters)}, "
        f"optimizer state {_gib(need.optimizer)}, activations {_gib(need.activations)}, "
        f"data {_gib(need.data)}) but {_gib(free)} is available; {_smaller(run)}",
        1,
    )
