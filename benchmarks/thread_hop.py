"""Benchmark: the round trip of a job between two threads, on one core and
across two, and what it costs a small Trainer step. Prints JSON.

Every device hop (the event loop hands a job to a device's worker thread and
gets the result back) is two thread wake-ups. On a virtual machine a wake-up
of a thread on another, idle, vCPU goes through the hypervisor; this measures
that price, so the small-step, tensor-parallel and parameter-server figures in
docs/benchmarks.md can be read against it:

- `same_cpu_us` / `other_cpu_us`: a value sent to an echo thread and back
  through two `queue.SimpleQueue`s (what `SerialWorker` uses), both threads
  pinned to one CPU / to two different CPUs; median over `--hops` round
  trips, then min and median over `--repeat` interleaved rounds.
- `trainer_step_us` with `one_core` and `all_cores`: the median `ask(Step)`
  of a `Trainer` (64-128-10 MLP, batch 32, SGD) in a child process pinned to
  one CPU (the loop and the device thread then share it) or free to use all.

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

STEP_SCRIPT = """
import asyncio, json, sys
sys.path.insert(0, {bench!r})
import numpy as np
import train_step
rng = np.random.default_rng(0)
x = rng.random((32, 64), dtype=np.float32)
y = rng.integers(0, 10, size=32)
model = train_step.Mlp([64, 128, 10], seed=0)
print(json.dumps(asyncio.run(train_step.trainer_time(model, x, y, 500))))
"""


def round_trip_us(hops: int, cpus: tuple[int, int] | None) -> float:
    """Median microseconds of one round trip to an echo thread.

    Args:
        hops: round trips to time (after 1,000 warm-up ones).
        cpus: (this thread's CPU, the echo thread's CPU), or None: unpinned.
    """
    to_echo: queue.SimpleQueue[int | None] = queue.SimpleQueue()
    back: queue.SimpleQueue[int] = queue.SimpleQueue()
    mask = os.sched_getaffinity(0)

    def echo() -> None:
        if cpus is not None:
            os.sched_setaffinity(0, {cpus[1]})
        while (item := to_echo.get()) is not None:
            back.put(item)

    thread = threading.Thread(target=echo, daemon=True)
    thread.start()
    if cpus is not None:
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


def trainer_step_us(one_core: bool) -> float:
    """The small Trainer step's median, in a fresh process (pinned to CPU 0 or not)."""
    bench = str(Path(__file__).resolve().parent)
    cmd = [sys.executable, "-c", STEP_SCRIPT.format(bench=bench)]
    if one_core:
        cmd = ["taskset", "-c", "0", *cmd]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)
    return float(json.loads(out.stdout.strip().splitlines()[-1])) * 1e6


def summary(values: list[float]) -> dict[str, float]:
    """Min and median, rounded."""
    return {"min": round(min(values), 1), "median": round(statistics.median(values), 1)}


def main() -> None:
    """Run the rounds interleaved and print one JSON object."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hops", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    result: dict[str, Any] = {"benchmark": "thread_hop", "cpus": len(cpus)}
    if len(cpus) < 2:
        result["skipped"] = "needs two CPUs"
        print(json.dumps(result))
        return
    runs: dict[str, list[float]] = {k: [] for k in ("same", "other", "one", "all")}
    for _ in range(args.repeat):
        runs["same"].append(round_trip_us(args.hops, (cpus[0], cpus[0])))
        runs["other"].append(round_trip_us(args.hops, (cpus[0], cpus[1])))
        runs["one"].append(trainer_step_us(one_core=True))
        runs["all"].append(trainer_step_us(one_core=False))
    result.update(
        {
            "same_cpu_us": summary(runs["same"]),
            "other_cpu_us": summary(runs["other"]),
            "trainer_step_us": {
                "one_core": summary(runs["one"]),
                "all_cores": summary(runs["all"]),
            },
        }
    )
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
