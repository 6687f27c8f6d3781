"""Messaging benchmark: atomr tell/ask against raw asyncio on the same loop.

Prints JSON. Each atomr figure is measured in the same run as its reference:
- tell: N fire-and-forget messages to one actor vs N ``put_nowait`` to an
  ``asyncio.Queue`` drained by one consumer task;
- ask: N sequential ask round trips vs N sequential raw round trips (a future
  put on an ``asyncio.Queue``, answered by a consumer task).
Best of ``--repeat`` runs each, interleaved.

    python benchmarks/messaging.py [--tells 500000] [--asks 50000] [--repeat 5] [--asyncio]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import time
from typing import Any

import atomr
from atomr import Actor, ActorSystem, Props


class _Counter(Actor):
    def __init__(self, n: int, done: asyncio.Future[float]) -> None:
        super().__init__()
        self.n = n
        self.seen = 0
        self.done = done

    def receive(self, message: Any) -> None:
        self.seen += 1
        if self.seen == self.n:
            self.done.set_result(time.perf_counter())


class _Echo(Actor):
    def receive(self, message: Any) -> Any:
        return message


async def raw_tell(n: int) -> float:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[int] = asyncio.Queue()
    done: asyncio.Future[float] = loop.create_future()

    async def consumer() -> None:
        get = queue.get
        for _ in range(n):
            await get()
        done.set_result(time.perf_counter())

    task = loop.create_task(consumer())
    await asyncio.sleep(0)
    start = time.perf_counter()
    put = queue.put_nowait
    for i in range(n):
        put(i)
    end = await done
    await task
    return n / (end - start)


async def atomr_tell(system: ActorSystem, n: int) -> float:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[float] = loop.create_future()
    ref = system.spawn(Props(_Counter, n, done))
    await asyncio.sleep(0)
    start = time.perf_counter()
    tell = ref.tell
    for i in range(n):
        tell(i)
    end = await done
    await ref.stop()
    return n / (end - start)


async def raw_ask(n: int) -> float:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[int, asyncio.Future[int]]] = asyncio.Queue()

    async def consumer() -> None:
        while True:
            message, fut = await queue.get()
            fut.set_result(message)

    task = loop.create_task(consumer())
    await asyncio.sleep(0)
    start = time.perf_counter()
    for i in range(n):
        fut = loop.create_future()
        queue.put_nowait((i, fut))
        await fut
    elapsed = time.perf_counter() - start
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return elapsed / n * 1e6


async def atomr_ask(system: ActorSystem, n: int) -> float:
    ref = system.spawn(Props(_Echo))
    await ref.ask(0)
    start = time.perf_counter()
    ask = ref.ask
    for i in range(n):
        await ask(i, timeout=5.0)
    elapsed = time.perf_counter() - start
    await ref.stop()
    return elapsed / n * 1e6


async def main(args: argparse.Namespace) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    results: dict[str, list[float]] = {k: [] for k in ("raw_tell", "tell", "raw_ask", "ask")}
    async with ActorSystem("bench") as system:
        for _ in range(args.repeat):
            results["raw_tell"].append(await raw_tell(args.tells))
            results["tell"].append(await atomr_tell(system, args.tells))
            results["raw_ask"].append(await raw_ask(args.asks))
            results["ask"].append(await atomr_ask(system, args.asks))
    raw_tell_best = max(results["raw_tell"])
    tell_best = max(results["tell"])
    raw_ask_best = min(results["raw_ask"])
    ask_best = min(results["ask"])
    return {
        "benchmark": "messaging",
        "loop": f"{type(loop).__module__}.{type(loop).__name__}",
        "python": platform.python_version(),
        "tells": args.tells,
        "asks": args.asks,
        "repeat": args.repeat,
        "raw_queue_msgs_per_s": round(raw_tell_best),
        "atomr_tell_msgs_per_s": round(tell_best),
        "tell_ratio": round(tell_best / raw_tell_best, 3),
        "raw_round_trip_us": round(raw_ask_best, 3),
        "atomr_ask_us": round(ask_best, 3),
        "ask_ratio": round(raw_ask_best / ask_best, 3),
    }


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--tells", type=int, default=500_000, help="messages per tell run")
    parser.add_argument("--asks", type=int, default=50_000, help="round trips per ask run")
    parser.add_argument("--repeat", type=int, default=5, help="runs of each, best kept")
    parser.add_argument("--asyncio", action="store_true", help="plain asyncio instead of uvloop")
    args = parser.parse_args(argv)
    for name in ("tells", "asks", "repeat"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    return args


if __name__ == "__main__":
    ns = parse()
    report = atomr.run(main(ns), use_uvloop=not ns.asyncio)
    json.dump(report, sys.stdout, indent=2)
    print()
