"""Benchmark: two CPU device actors doing matmuls concurrently vs the same work in sequence.

Prints JSON with both wall times and ``speedup`` = sequential_s / concurrent_s.
BLAS threads are shared (max(1, cores // live CPU devices)), so the figure
shows what running device actors side by side buys over one after the other
under the same thread budget.

    .venv/bin/python benchmarks/device_parallel.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

import numpy as np

from atomr.accel import DeviceActor, backend_for
from atomr.accel.device_actor import OnDevice
from atomr.accel.threads import blas_threads
from atomr.actor import ActorSystem, Props


def work(device: str, a: np.ndarray, b: np.ndarray, reps: int) -> float:
    """``reps`` matmuls plus a GELU on one device; returns a checksum."""
    be = backend_for(device)
    out = np.empty((a.shape[0], b.shape[1]), np.float32)
    act = np.empty_like(out)
    for _ in range(reps):
        be.matmul(a, b, out)
        be.activation_forward("gelu", out, act)
    return float(act[0, 0])


async def run(size: int, reps: int, repeat: int) -> dict[str, object]:
    """Time concurrent and sequential runs on two CPU device actors."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((size, size)).astype(np.float32) for _ in range(2))
    async with ActorSystem("bench") as system:
        refs = [system.spawn(Props(DeviceActor, f"cpu:{i}")) for i in range(2)]
        jobs = [OnDevice(work, f"cpu:{i}", a, b, reps) for i in range(2)]
        await asyncio.gather(*(r.ask(j, timeout=600) for r, j in zip(refs, jobs, strict=True)))
        threads = blas_threads()
        conc, seq = [], []
        for _ in range(repeat):
            t0 = time.perf_counter()
            await asyncio.gather(*(r.ask(j, timeout=600) for r, j in zip(refs, jobs, strict=True)))
            conc.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            for r, j in zip(refs, jobs, strict=True):
                await r.ask(j, timeout=600)
            seq.append(time.perf_counter() - t0)
    return {
        "benchmark": "device_parallel",
        "devices": 2,
        "cores": os.cpu_count(),
        "blas_threads_per_device": threads,
        "matmul_size": size,
        "matmuls_per_device": reps,
        "concurrent_s": min(conc),
        "sequential_s": min(seq),
        "speedup": round(min(seq) / min(conc), 2),
    }


def main() -> None:
    """Run the benchmark and print JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes")
    args = parser.parse_args()
    size, reps, repeat = (256, 10, 3) if args.quick else (512, 20, 5)
    print(json.dumps(asyncio.run(run(size, reps, repeat)), indent=2))


if __name__ == "__main__":
    main()
