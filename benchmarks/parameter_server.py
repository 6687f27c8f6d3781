"""Benchmark: parameter-server throughput against the data-parallel trainer,
same model, same workers/replicas, same data, same run. Prints JSON.

Model: MLP 64-256-256-10 (digits-sized input), cross-entropy, SGD momentum;
global batch `--batch` split over `--workers` workers on logical CPU devices.

Figures, each over `--steps` global batches after a warm-up:

- `data_parallel`: `DataParallelTrainer` `Step`s; gradients/s counts one
  gradient per replica per step (the reference).
- `ps_sync`, `ps_async`, `ps_async_2_shards`: one `TrainEpochs` epoch
  over the same batches; pushes/s are `PushGradient`s answered per second
  (all shards' pushes of one gradient count as one), applied/s are
  gradients folded into the weights per second.

Ratios are parameter server / data parallel, in gradients per second
(higher is better), taken within each of `--repeat` interleaved rounds;
gradients/s and ratios are printed as [best, median].

    python benchmarks/parameter_server.py [--steps 60] [--workers 4] [--batch 256] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import time
from typing import Any

import numpy as np
from _args import count

from atomr import ActorSystem
from atomr.accel import cpu_devices
from atomr.train import LossKind, Mlp, OptimizerKind, Step, TrainerConfig
from atomr.train.core import synthetic_classification
from atomr.train.data_parallel.trainer import DataParallelTrainer
from atomr.train.parameter_server import (
    AsyncParameterServer,
    Consistency,
    GetServerStats,
    ParameterServerOptions,
    TrainEpochs,
)

SIZES = [64, 256, 256, 10]


async def bench_data_parallel(
    system: Any, config: TrainerConfig, args: Any, x: Any, y: Any
) -> dict:
    ref = await DataParallelTrainer.spawn(system, Mlp(SIZES), cpu_devices(args.workers), config)
    await ref.ask(Step(x[: args.batch], y[: args.batch]))  # warm-up
    t0 = time.perf_counter()
    for i in range(args.steps):
        sl = slice(i * args.batch, (i + 1) * args.batch)
        await ref.ask(Step(x[sl], y[sl]), timeout=60.0)
    seconds = time.perf_counter() - t0
    ref.stop()
    return {
        "seconds": seconds,
        "steps_per_s": args.steps / seconds,
        "gradients_per_s": args.steps * args.workers / seconds,
    }


async def bench_ps(
    system: Any,
    config: TrainerConfig,
    args: Any,
    x: Any,
    y: Any,
    consistency: Consistency,
    shards: int,
) -> dict:
    options = ParameterServerOptions(workers=args.workers, consistency=consistency, shards=shards)
    ps = await AsyncParameterServer.spawn(
        system, Mlp(SIZES), cpu_devices(args.workers), config, options
    )
    await ps.ask(Step(x[: args.batch], y[: args.batch]), timeout=60.0)  # warm-up
    before = await ps.ask(GetServerStats())
    n = args.steps * args.batch
    t0 = time.perf_counter()
    await ps.ask(TrainEpochs(x[:n], y[:n], 1, args.batch), timeout=600.0)
    seconds = time.perf_counter() - t0
    after = await ps.ask(GetServerStats())
    await ps.stop()
    applied = after[0].gradients_applied - before[0].gradients_applied
    pulls = after[0].weights_pulled - before[0].weights_pulled
    pushes = args.steps * args.workers + (
        after[0].gradients_rejected - before[0].gradients_rejected
    )
    return {
        "seconds": seconds,
        "pushes_per_s": pushes / seconds,
        "applied_per_s": applied / seconds,
        "gradients_per_s": applied / seconds,
        "versions_per_s": (after[0].version - before[0].version) / seconds,
        "pulls": pulls,
        "avg_staleness": after[0].avg_staleness,
    }


CASES = [
    ("ps_sync", Consistency.synchronous(), 1),
    ("ps_async", Consistency.asynchronous(), 1),
    ("ps_async_2_shards", Consistency.asynchronous(), 2),
]


def _summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per case: gradients/s (best, median) and the ratio to data parallel
    taken within each round (best, median), plus the last round's counters."""
    out: dict[str, Any] = {}
    for name in ["data_parallel", *(c[0] for c in CASES)]:
        rates = [r[name]["gradients_per_s"] for r in rounds]
        ratios = [
            r[name]["gradients_per_s"] / r["data_parallel"]["gradients_per_s"] for r in rounds
        ]
        last = {k: v for k, v in rounds[-1][name].items() if k not in ("seconds",)}
        out[name] = {
            **last,
            "gradients_per_s": [round(max(rates), 1), round(statistics.median(rates), 1)],
            "ratio_vs_data_parallel": [round(max(ratios), 3), round(statistics.median(ratios), 3)],
        }
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=count, default=60)
    parser.add_argument("--workers", type=count, default=4)
    parser.add_argument("--batch", type=count, default=256)
    parser.add_argument("--repeat", type=count, default=3, help="interleaved rounds of every case")
    args = parser.parse_args()
    x, y = synthetic_classification(args.batch * (args.steps + 1), SIZES[0], SIZES[-1], seed=0)
    config = TrainerConfig(OptimizerKind.sgd(0.01, momentum=0.9), LossKind.CROSS_ENTROPY)
    rounds: list[dict[str, Any]] = []
    async with ActorSystem("bench-ps") as system:
        for _ in range(args.repeat):
            results: dict[str, Any] = {}
            results["data_parallel"] = await bench_data_parallel(system, config, args, x, y)
            for name, consistency, shards in CASES:
                results[name] = await bench_ps(system, config, args, x, y, consistency, shards)
            rounds.append(results)
    summary = _summary(rounds)
    print(
        json.dumps(
            {
                "benchmark": "parameter_server",
                "model": SIZES,
                "workers": args.workers,
                "global_batch": args.batch,
                "steps": args.steps,
                "repeat": args.repeat,
                "python": platform.python_version(),
                "numpy": np.__version__,
                "results": {
                    k: {m: round(v, 4) if isinstance(v, float) else v for m, v in r.items()}
                    for k, r in summary.items()
                },
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
