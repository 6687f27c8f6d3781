"""Benchmark: data-parallel training step and the host all-reduce. Prints JSON.

Figures (median seconds over `--repeat` calls after a warm-up, best of
`--rounds` interleaved rounds):

- `numpy_step`: the hand-written single-process NumPy step of
  benchmarks/train_step.py (784-1024-1024-10 MLP, global batch 512,
  cross-entropy, SGD lr 0.01), measured while no device actor is alive (so
  NumPy's BLAS has every core).
- `dp_host_step` / `dp_ring_step`: `await trainer.ask(Step(x, y))` on a
  `DataParallelTrainer` with 2 CPU replicas ("cpu:0", "cpu:1"; each gets
  cores // 2 BLAS threads) and the host or ring collective, same batch.
- `host_all_reduce`: `HostCollective.all_reduce` of 4 buffers of 16 MB
  (4 Mi float32 each) against the bare NumPy sum of the same buffers
  (`np.add(a, b, out=o); np.add(o, c, out=o); np.add(o, d, out=o)`).

Ratios are atomr / reference (lower is better; targets: step <= 1.10,
all-reduce <= 1.2). Before timing, one data-parallel step is checked against
the NumPy step from the same weights.

    python benchmarks/data_parallel.py [--repeat 20] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from _args import count

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_step import LR, SIZES, numpy_step, timed  # noqa: E402

from atomr import ActorSystem  # noqa: E402
from atomr.accel import cpu_devices  # noqa: E402
from atomr.accel.threads import available_cores, blas_threads  # noqa: E402
from atomr.train import (  # noqa: E402
    DataParallelOptions,
    DataParallelTrainer,
    GetWeights,
    LossKind,
    Mlp,
    OptimizerKind,
    Step,
    TrainerConfig,
)
from atomr.train.comm import HostCollective  # noqa: E402

CONFIG = TrainerConfig(OptimizerKind.sgd(LR), LossKind.CROSS_ENTROPY)


async def dp_time(
    model: Mlp, x: np.ndarray, y: np.ndarray, repeat: int, collective: str
) -> tuple[float, np.ndarray]:
    """Median seconds of `ask(Step)` on a 2-replica trainer, and its weights
    after one step (from the model's weights) for the correctness check."""
    async with ActorSystem("bench") as system:
        ref = await DataParallelTrainer.spawn(
            system, model, cpu_devices(2), CONFIG, DataParallelOptions(collective)
        )
        await ref.ask(Step(x, y), timeout=60)
        after_one = await ref.ask(GetWeights(), timeout=60)
        await ref.ask(Step(x, y), timeout=60)
        samples = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            await ref.ask(Step(x, y), timeout=60)
            samples.append(time.perf_counter() - t0)
    return statistics.median(samples), after_one


async def all_reduce_time(buffers: list[np.ndarray], repeat: int) -> float:
    """Median seconds of `HostCollective.all_reduce(buffers)`."""
    host = HostCollective()
    for _ in range(2):
        await host.all_reduce(buffers)
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        await host.all_reduce(buffers)
        samples.append(time.perf_counter() - t0)
    host.close()
    return statistics.median(samples)


def main() -> None:
    """Run the benchmark and print one JSON object."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeat", type=count, default=20)
    parser.add_argument("--rounds", type=count, default=3)
    parser.add_argument("--batch", type=count, default=512)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    x = rng.random((args.batch, SIZES[0]), dtype=np.float32)
    y = rng.integers(0, SIZES[-1], size=args.batch)
    model = Mlp(SIZES, seed=0)
    blas_alone = blas_threads()

    # correctness: one data-parallel step equals the NumPy step from the same weights
    ref_params = model.get_params()
    numpy_step(ref_params, x, y)
    _, dp_one = asyncio.run(dp_time(model, x, y, 1, "host"))
    max_diff = float(np.abs(dp_one - ref_params).max())

    params = model.get_params()
    mb16 = 4 * 1024 * 1024  # float32 elements in 16 MB
    buffers = [rng.standard_normal(mb16).astype(np.float32) for _ in range(4)]
    out = np.empty_like(buffers[0])

    def numpy_sum() -> None:
        np.add(buffers[0], buffers[1], out=out)
        np.add(out, buffers[2], out=out)
        np.add(out, buffers[3], out=out)

    results: dict[str, list[float]] = {k: [] for k in ("numpy", "host", "ring", "np_add", "ar")}
    for _ in range(args.rounds):
        results["numpy"].append(timed(lambda: numpy_step(params, x, y), args.repeat))
        results["host"].append(asyncio.run(dp_time(model, x, y, args.repeat, "host"))[0])
        results["ring"].append(asyncio.run(dp_time(model, x, y, args.repeat, "ring"))[0])
        results["np_add"].append(timed(numpy_sum, args.repeat))
        results["ar"].append(asyncio.run(all_reduce_time(buffers, args.repeat)))
    best: dict[str, Any] = {k: min(v) for k, v in results.items()}
    print(
        json.dumps(
            {
                "benchmark": "data_parallel",
                "model": SIZES,
                "global_batch": args.batch,
                "replicas": ["cpu:0", "cpu:1"],
                "loss": "cross_entropy",
                "optimizer": f"sgd(lr={LR})",
                "repeat": args.repeat,
                "rounds": args.rounds,
                "numpy_step_s": round(best["numpy"], 6),
                "dp_host_step_s": round(best["host"], 6),
                "dp_ring_step_s": round(best["ring"], 6),
                "dp_host_ratio": round(best["host"] / best["numpy"], 3),
                "dp_ring_ratio": round(best["ring"] / best["numpy"], 3),
                "all_reduce": {"buffers": 4, "mbytes_each": 16},
                "numpy_add_s": round(best["np_add"], 6),
                "host_all_reduce_s": round(best["ar"], 6),
                "all_reduce_ratio": round(best["ar"] / best["np_add"], 3),
                "check": {"max_weight_diff_after_one_step": max_diff},
                "cores": available_cores(),
                "blas_threads_numpy_step": blas_alone,
                "machine": platform.machine(),
                "python": platform.python_version(),
                "numpy": np.__version__,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
