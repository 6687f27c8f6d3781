"""Actor spawn benchmark: atomr against asyncio tasks with queues, in one run.

Prints JSON. Each atomr figure is measured in the same run as its reference:
- spawn: N actors spawned, each told one message, until all N have handled
  it, vs N ``TaskGroup``-style tasks, each with an ``asyncio.Queue`` and one
  message put on it, until all N have taken it;
- memory: bytes per idle actor (``tracemalloc``, after the first message) vs
  per idle task + queue;
- import: ``import atomr`` vs ``import pykka`` (when installed), each in a
  fresh interpreter; and the first use of the runtime
  (``from atomr import ActorSystem``, which imports asyncio) vs the same
  ``import pykka``.
``--repeat`` runs of each, interleaved; the best and the median are printed,
and the ratios of both (``ratio``: of the best).

    python benchmarks/actors.py [--actors 100000] [--repeat 5] [--asyncio]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import json
import platform
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from typing import Any

from _args import count

import atomr
from atomr import Actor, ActorSystem, Props


class _CountDown(Actor):
    def receive(self, message: Any) -> None:
        message[0] -= 1
        if message[0] == 0:
            message[1].set_result(None)


async def _countdown_task(queue: asyncio.Queue[Any]) -> None:
    while True:
        message = await queue.get()
        message[0] -= 1
        if message[0] == 0:
            message[1].set_result(None)


async def raw_spawn(n: int) -> float:
    """Microseconds per task + queue + first message handled."""
    loop = asyncio.get_running_loop()
    counter = [n, loop.create_future()]
    start = time.perf_counter()
    tasks = []
    for _ in range(n):
        queue: asyncio.Queue[Any] = asyncio.Queue()
        tasks.append(loop.create_task(_countdown_task(queue)))
        queue.put_nowait(counter)
    await counter[1]
    elapsed = time.perf_counter() - start
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return elapsed / n * 1e6


async def atomr_spawn(n: int) -> float:
    """Microseconds per actor spawned + first message handled."""
    system = ActorSystem("spawn")
    counter = [n, asyncio.get_running_loop().create_future()]
    props = Props(_CountDown)
    start = time.perf_counter()
    for _ in range(n):
        system.spawn(props).tell(counter)
    await counter[1]
    elapsed = time.perf_counter() - start
    await system.terminate()
    return elapsed / n * 1e6


async def _bytes_per(n: int, make: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
    """Bytes per item that ``make()`` allocates, and what it made (to clean up)."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    made = await make()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return (after - before) / n, made


async def raw_memory(n: int) -> float:
    """Bytes per idle task + queue that has taken one message."""
    loop = asyncio.get_running_loop()

    async def make() -> list[Any]:
        counter = [n, loop.create_future()]
        made = []
        for _ in range(n):
            queue: asyncio.Queue[Any] = asyncio.Queue()
            made.append((loop.create_task(_countdown_task(queue)), queue))
            queue.put_nowait(counter)
        await counter[1]
        return made

    per, made = await _bytes_per(n, make)
    for task, _ in made:
        task.cancel()
    await asyncio.gather(*(task for task, _ in made), return_exceptions=True)
    return per


async def atomr_memory(n: int) -> float:
    """Bytes per idle actor that has handled one message."""
    system = ActorSystem("memory")
    loop = asyncio.get_running_loop()

    async def make() -> list[Any]:
        counter = [n, loop.create_future()]
        refs = [system.spawn(Props(_CountDown)) for _ in range(n)]
        for ref in refs:
            ref.tell(counter)
        await counter[1]
        return refs

    per, _ = await _bytes_per(n, make)
    await system.terminate()
    return per


def import_seconds(module: str, statement: str = "") -> float | None:
    """Wall time of ``statement`` (default ``import module``) in a fresh interpreter.

    None: ``module`` is not installed.
    """
    if importlib.util.find_spec(module) is None:
        return None
    statement = statement or f"import {module}"
    code = f"import time; t = time.perf_counter(); {statement}; print(time.perf_counter() - t)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def _stats(values: list[float]) -> tuple[float, float]:
    return min(values), statistics.median(values)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    names = (
        "raw_spawn",
        "spawn",
        "raw_bytes",
        "bytes",
        "pykka_import",
        "atomr_import",
        "atomr_first_use",
    )
    results: dict[str, list[float]] = {k: [] for k in names}
    for _ in range(args.repeat):
        results["raw_spawn"].append(await raw_spawn(args.actors))
        results["spawn"].append(await atomr_spawn(args.actors))
        results["raw_bytes"].append(await raw_memory(args.memory_actors))
        results["bytes"].append(await atomr_memory(args.memory_actors))
        for module in ("pykka", "atomr"):
            seconds = import_seconds(module)
            if seconds is not None:
                results[f"{module}_import"].append(seconds)
        first_use = import_seconds("atomr", "from atomr import ActorSystem")
        results["atomr_first_use"].append(first_use or 0.0)
    report: dict[str, Any] = {
        "benchmark": "actors",
        "loop": type(asyncio.get_running_loop()).__name__,
        "python": platform.python_version(),
        "actors": args.actors,
        "repeat": args.repeat,
    }
    for ref_name, name, label in (
        ("raw_spawn", "spawn", "spawn_us"),
        ("raw_bytes", "bytes", "bytes_per_idle_actor"),
        ("pykka_import", "atomr_import", "import_s"),
        ("pykka_import", "atomr_first_use", "first_use_s"),
    ):
        if not results[ref_name] or not results[name]:
            report[f"{label}_ratio"] = f"reference {ref_name} not installed"
            continue
        (ref_min, ref_med), (min_, med) = _stats(results[ref_name]), _stats(results[name])
        report[f"reference_{label}"] = round(ref_min, 4)
        report[f"atomr_{label}"] = round(min_, 4)
        report[f"{label}_ratio"] = round(min_ / ref_min, 3)
        report[f"{label}_ratio_median"] = round(med / ref_med, 3)
    return report


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--actors", type=count, default=100_000, help="actors per spawn run")
    parser.add_argument("--memory-actors", type=count, default=20_000, help="actors per memory run")
    parser.add_argument("--repeat", type=count, default=5, help="runs of each, interleaved")
    parser.add_argument("--asyncio", action="store_true", help="plain asyncio instead of uvloop")
    return parser.parse_args(argv)  # each count >= 1: _args.count


if __name__ == "__main__":
    ns = parse()
    report = atomr.run(main(ns), use_uvloop=not ns.asyncio)
    json.dump(report, sys.stdout, indent=2)
    print()
