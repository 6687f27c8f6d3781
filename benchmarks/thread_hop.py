"""Benchmark: the round trip of a job between two threads, on one vCPU and
across two, and what it costs a small Trainer step. Prints JSON.

Every device hop (the event loop hands a job to a device's worker thread and
gets the result back) is two thread wake-ups: `SerialWorker` hands the job
over through a `queue.SimpleQueue` and the result back through the loop's
`call_soon_threadsafe`. On a virtual machine, waking a thread on another,
idle, vCPU goes through the hypervisor; this measures that price, so the
small-step, tensor-parallel and parameter-server figures in
docs/benchmarks.md can be read against it:

- `same_cpu_us` / `other_cpu_us`: a value sent to an echo thread and back
  through two `SimpleQueue`s, both threads pinned to one CPU / to two
  different CPUs; median over `--hops` round trips, then min and median over
  `--repeat` interleaved rounds.
- `one_core` / `all_cores`: in a child process pinned to one CPU (the event
  loop and the device thread then share it) or free to use every CPU, each
  with BLAS at one thread (`OPENBLAS_NUM_THREADS=1`, so that only the
  placement differs): `device_hop_us`, a no-op `OnDevice` ask to a
  `DeviceActor` (a whole device hop); `numpy_step_us` and `trainer_step_us`,
  the 64-128-10 MLP step (batch 32, SGD) of `train_step.py` in plain NumPy
  and as a `Trainer`'s `ask(Step)`; `trainer_ratio`, their quotient.

    python benchmarks/thread_hop.py [--hops 20000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from _args import count

STEP_SCRIPT = """
import asyncio, json, statistics, sys, time
sys.path.insert(0, {bench!r})
import numpy as np
import train_step
from atomr import ActorSystem, Props
from atomr.accel import DeviceActor
from atomr.accel.device_actor import OnDevice

async def device_hop(repeat):
    async with ActorSystem("hop") as system:
        ref = system.spawn(Props(DeviceActor, "cpu:0"))
        samples = []
        for i in range(repeat + 100):
            t0 = time.perf_counter()
            await ref.ask(OnDevice(int), timeout=60)
            if i >= 100:
                samples.append(time.perf_counter() - t0)
    return statistics.median(samples)

rng = np.random.default_rng(0)
x = rng.random((32, 64), dtype=np.float32)
y = rng.integers(0, 10, size=32)
train_step.SIZES[:] = [64, 128, 10]  # numpy_step reads the widths from there
model = train_step.Mlp(train_step.SIZES, seed=0)
params = model.get_params()
numpy_s = train_step.timed(lambda: train_step.numpy_step(params, x, y), 500)
trainer_s = asyncio.run(train_step.trainer_time(model, x, y, 500))
hop_s = asyncio.run(device_hop(2000))
print(json.dumps([hop_s, numpy_s, trainer_s]))
"""


def round_trip_us(hops: int, cpus: tuple[int, int]) -> float:
    """Median microseconds of one round trip to an echo thread.

    Args:
        hops: round trips to time (after 1,000 warm-up ones).
        cpus: (this thread's CPU, the echo thread's CPU).
    """
    to_echo: queue.SimpleQueue[int | None] = queue.SimpleQueue()
    back: queue.SimpleQueue[int] = queue.SimpleQueue()
    mask = os.sched_getaffinity(0)

    def echo() -> None:
        os.sched_setaffinity(0, {cpus[1]})
        while (item := to_echo.get()) is not None:
            back.put(item)

    thread = threading.Thread(target=echo, daemon=True)
    thread.start()
    os.sched_setaffinity(0, {cpus[0]})
    try:
        for i in range(1000):
            to_echo.put(i)
            back.get()
        samples = []
        for i in range(hops):
            t0 = time.perf_counter()
            to_echo.put(i)
            back.get()
            samples.append(time.perf_counter() - t0)
    finally:
        to_echo.put(None)
        thread.join()
        os.sched_setaffinity(0, mask)
    return statistics.median(samples) * 1e6


def child_figures(cpu: int | None) -> tuple[float, float, float]:
    """(device hop, NumPy step, Trainer step) in microseconds, measured in a
    fresh process with BLAS at one thread, pinned to `cpu` (None: not pinned)."""
    bench = str(Path(__file__).resolve().parent)
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}

    def pin() -> None:
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})

    out = subprocess.run(
        [sys.executable, "-c", STEP_SCRIPT.format(bench=bench)],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        preexec_fn=pin,
    )
    hop, numpy_step, trainer_step = json.loads(out.stdout.strip().splitlines()[-1])
    return hop * 1e6, numpy_step * 1e6, trainer_step * 1e6


def summary(values: list[float]) -> dict[str, float]:
    """Min and median, rounded."""
    return {"min": round(min(values), 1), "median": round(statistics.median(values), 1)}


def main() -> None:
    """Run the rounds interleaved and print one JSON object."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hops", type=count, default=20000)
    parser.add_argument("--repeat", type=count, default=3)
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    result: dict[str, Any] = {"benchmark": "thread_hop", "cpus": len(cpus)}
    if len(cpus) < 2:
        result["skipped"] = "needs two CPUs"
        print(json.dumps(result))
        return
    runs: dict[str, list[float]] = {"same": [], "other": []}
    children: dict[str, list[tuple[float, float, float]]] = {"one_core": [], "all_cores": []}
    for _ in range(args.repeat):
        runs["same"].append(round_trip_us(args.hops, (cpus[0], cpus[0])))
        runs["other"].append(round_trip_us(args.hops, (cpus[0], cpus[1])))
        children["one_core"].append(child_figures(cpus[0]))
        children["all_cores"].append(child_figures(None))
    result["same_cpu_us"] = summary(runs["same"])
    result["other_cpu_us"] = summary(runs["other"])
    for placement, figures in children.items():
        result[placement] = {
            "device_hop_us": summary([f[0] for f in figures]),
            "numpy_step_us": summary([f[1] for f in figures]),
            "trainer_step_us": summary([f[2] for f in figures]),
            "trainer_ratio": summary([f[2] / f[1] for f in figures]),
        }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
