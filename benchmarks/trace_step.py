"""Trace one data-parallel `Step` and count the atomr functions and files it
enters (issue 15's measure of how spread out one step is). Prints JSON.

The trainer is built as `atomr train --strategy data` builds it (an MLP
64-128-10 over 2 logical CPU devices, Adam, cross-entropy, batch 64); a
warm-up step compiles the kernels, then one more step is traced with
`sys.setprofile` on the event loop's thread and `threading.setprofile` on the
device threads. Only code under the `atomr` package counts.

    python benchmarks/trace_step.py
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np

import atomr

ROOT = Path(atomr.__file__).resolve().parent


def _contract() -> tuple[Any, Any, Any, Any, Any]:
    """The names one data-parallel step needs, wherever the layout puts them."""
    from atomr.train import DataParallelTrainer, LossKind, Mlp, OptimizerKind, Step, TrainerConfig

    return DataParallelTrainer, LossKind, Mlp, OptimizerKind, (TrainerConfig, Step)


async def trace_one_step() -> dict[str, Any]:
    """Spawn the trainer, warm it up, trace one step; return the counts."""
    from atomr.accel import cpu_devices

    trainer_cls, loss_kind, mlp, optimizer_kind, (config_cls, step_cls) = _contract()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 64)).astype(np.float32)
    y = rng.integers(0, 10, 64).astype(np.int64)
    config = config_cls(optimizer_kind.adam(0.005), loss_kind.CROSS_ENTROPY)
    entered: set[tuple[str, str, int]] = set()
    recording = threading.Event()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event != "call" or not recording.is_set():
            return
        code = frame.f_code
        path = Path(code.co_filename)
        if ROOT in path.parents:
            entered.add((str(path.relative_to(ROOT)), code.co_name, code.co_firstlineno))

    # Device threads start with the system: install the hook before it.
    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        async with atomr.ActorSystem("trace") as system:
            model = mlp([64, 128, 10], seed=0)
            ref = await trainer_cls.spawn(system, model, cpu_devices(2), config)
            await ref.ask(step_cls(x, y), timeout=60)
            recording.set()
            await ref.ask(step_cls(x, y), timeout=60)
            recording.clear()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    files = sorted({f for f, _, _ in entered})
    return {
        "functions": len(entered),
        "files": len(files),
        "file_list": files,
    }


def main() -> None:
    """Print the counts as JSON."""
    print(json.dumps(asyncio.run(trace_one_step()), indent=1))


if __name__ == "__main__":
    main()
