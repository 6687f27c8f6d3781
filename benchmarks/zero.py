"""Benchmark: sharded data parallel (ZeRO stages 1-3). Prints JSON.

Memory: per-replica bytes of weights, gradients, optimizer state, the
atomic update's second set and the largest transient buffer, as each
replica measures them from the arrays it holds (`GetShardMemory`), after
one AdamW step of a 784-1024-1024-10 MLP (1.86 M parameters, 7.5 MB in
float32) at N = 1, 2, 4 replicas; `full_vector_bytes` is one whole float32
vector for scale. Speed: the step time of each stage against
`DataParallelTrainer` (host collective) in the same run, N = 2 CPU
replicas, batch 512, AdamW; `--rounds` interleaved rounds of `--repeat`
steps each (the median step of a round), reported as min and median over
the rounds, with the ratio to data parallel (goal: stages 1 and 2 within
1.10x).

    python benchmarks/zero.py [--repeat 10] [--rounds 3] [--no-memory]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

import numpy as np
from _args import count

from atomr import ActorSystem
from atomr.accel import cpu_devices
from atomr.train import (
    DataParallelTrainer,
    LossKind,
    Mlp,
    OptimizerKind,
    ShardedDataParallelTrainer,
    ShardedOptions,
    Step,
    TrainerConfig,
)
from atomr.train.sharded import GetShardMemory

SIZES = [784, 1024, 1024, 10]
BATCH = 512
CONFIG = TrainerConfig(OptimizerKind.adamw(1e-3), LossKind.CROSS_ENTROPY)


def _batch(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((BATCH, SIZES[0])).astype(np.float32), rng.integers(0, 10, BATCH)


async def memory_table() -> list[dict[str, Any]]:
    """Per-replica bytes for each stage and N (the largest replica's)."""
    rows = []
    x, y = _batch()
    async with ActorSystem("zero-memory") as system:
        for stage in (1, 2, 3):
            for n in (1, 2, 4):
                ref = await ShardedDataParallelTrainer.spawn(
                    system, Mlp(SIZES), cpu_devices(n), CONFIG, ShardedOptions(stage=stage)
                )
                await ref.ask(Step(x, y), timeout=120)
                memory = await ref.ask(GetShardMemory(), timeout=120)
                worst = max(memory, key=lambda m: m.persistent)
                rows.append({"stage": stage, "replicas": n, **worst.__dict__})
                await ref.stop()
    return rows


async def _median_step(ref: Any, x: np.ndarray, y: np.ndarray, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        await ref.ask(Step(x, y), timeout=120)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


async def speed(repeat: int, rounds: int) -> dict[str, Any]:
    """Interleaved rounds: data parallel, then each stage; min and median."""
    x, y = _batch(1)
    samples: dict[str, list[float]] = {"data": [], "zero1": [], "zero2": [], "zero3": []}
    async with ActorSystem("zero-speed") as system:
        devices = cpu_devices(2)
        refs = {"data": await DataParallelTrainer.spawn(system, Mlp(SIZES), devices, CONFIG)}
        for stage in (1, 2, 3):
            refs[f"zero{stage}"] = await ShardedDataParallelTrainer.spawn(
                system, Mlp(SIZES), devices, CONFIG, ShardedOptions(stage=stage)
            )
        for ref in refs.values():  # warm-up: kernels compiled, buffers allocated
            await _median_step(ref, x, y, 2)
        for _ in range(rounds):
            for name, ref in refs.items():
                samples[name].append(await _median_step(ref, x, y, repeat))
    out: dict[str, Any] = {}
    for name, values in samples.items():
        out[f"{name}_step_s"] = {"min": min(values), "median": statistics.median(values)}
        if name != "data":
            base = samples["data"]
            out[f"{name}_vs_data"] = {
                "min": min(values) / min(base),
                "median": statistics.median(values) / statistics.median(base),
            }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=count, default=10)
    parser.add_argument("--rounds", type=count, default=3)
    parser.add_argument("--no-memory", action="store_true")
    args = parser.parse_args()
    report: dict[str, Any] = {"full_vector_bytes": Mlp(SIZES).n_params * 4}
    if not args.no_memory:
        report["memory"] = asyncio.run(memory_table())
    report["speed"] = asyncio.run(speed(args.repeat, args.rounds))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
