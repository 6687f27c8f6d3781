"""Messaging benchmark: atomr tell/ask against raw asyncio on the same loop.

Prints JSON. Each atomr figure is measured in the same run as its reference:
- tell: N fire-and-forget messages to one actor vs N ``put_nowait`` to an
  ``asyncio.Queue`` drained by one consumer task;
- ask: N sequential ask round trips vs N sequential raw round trips (a future
  put on an ``asyncio.Queue``, answered by a consumer task);
- thread tell: N tells from a plain thread to one actor vs N
  ``loop.call_soon_threadsafe`` calls of a counting callback, each until the
  loop has seen all N.
``--repeat`` runs of each, interleaved; the best and the median of each are
printed, and the ratios of both (the ``ratio`` fields: of the best).

    python benchmarks/messaging.py [--tells 500000] [--asks 50000] [--thread-tells 200000]
                                   [--repeat 5] [--asyncio]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from _args import count

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


async def _from_thread(n: int, send: Callable[[int], None], done: asyncio.Future[float]) -> float:
    """Messages per second: ``send(i)`` N times from a plain thread, until ``done``."""
    start = time.perf_counter()
    thread = threading.Thread(target=lambda: [send(i) for i in range(n)])
    thread.start()
    end = await done
    await asyncio.to_thread(thread.join)
    return n / (end - start)


async def raw_thread_tell(n: int) -> float:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[float] = loop.create_future()
    seen = [0]

    def count(i: int) -> None:
        seen[0] += 1
        if seen[0] == n:
            done.set_result(time.perf_counter())

    call = loop.call_soon_threadsafe
    return await _from_thread(n, lambda i: call(count, i), done)


async def atomr_thread_tell(system: ActorSystem, n: int) -> float:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[float] = loop.create_future()
    ref = system.spawn(Props(_Counter, n, done))
    await asyncio.sleep(0)
    rate = await _from_thread(n, ref.tell, done)
    await ref.stop()
    return rate


def _best_and_median(values: list[float], higher_is_better: bool) -> tuple[float, float]:
    best = max(values) if higher_is_better else min(values)
    return best, statistics.median(values)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    names = ("raw_tell", "tell", "raw_ask", "ask", "raw_thread_tell", "thread_tell")
    results: dict[str, list[float]] = {k: [] for k in names}
    async with ActorSystem("bench") as system:
        for _ in range(args.repeat):
            results["raw_tell"].append(await raw_tell(args.tells))
            results["tell"].append(await atomr_tell(system, args.tells))
            results["raw_ask"].append(await raw_ask(args.asks))
            results["ask"].append(await atomr_ask(system, args.asks))
            results["raw_thread_tell"].append(await raw_thread_tell(args.thread_tells))
            results["thread_tell"].append(await atomr_thread_tell(system, args.thread_tells))
    raw_q, tell = (_best_and_median(results[k], True) for k in ("raw_tell", "tell"))
    raw_rt, ask = (_best_and_median(results[k], False) for k in ("raw_ask", "ask"))
    raw_thread, thread = (
        _best_and_median(results[k], True) for k in ("raw_thread_tell", "thread_tell")
    )
    return {
        "benchmark": "messaging",
        "loop": f"{type(loop).__module__}.{type(loop).__name__}",
        "python": platform.python_version(),
        "tells": args.tells,
        "asks": args.asks,
        "thread_tells": args.thread_tells,
        "repeat": args.repeat,
        "raw_queue_msgs_per_s": round(raw_q[0]),
        "atomr_tell_msgs_per_s": round(tell[0]),
        "tell_ratio": round(tell[0] / raw_q[0], 3),
        "tell_ratio_median": round(tell[1] / raw_q[1], 3),
        "raw_round_trip_us": round(raw_rt[0], 3),
        "atomr_ask_us": round(ask[0], 3),
        "ask_ratio": round(raw_rt[0] / ask[0], 3),
        "ask_ratio_median": round(raw_rt[1] / ask[1], 3),
        "call_soon_threadsafe_msgs_per_s": round(raw_thread[0]),
        "atomr_thread_tell_msgs_per_s": round(thread[0]),
        "thread_tell_ratio": round(thread[0] / raw_thread[0], 3),
        "thread_tell_ratio_median": round(thread[1] / raw_thread[1], 3),
    }


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--tells", type=count, default=500_000, help="messages per tell run")
    parser.add_argument("--asks", type=count, default=50_000, help="round trips per ask run")
    parser.add_argument(
        "--thread-tells", type=count, default=200_000, help="messages per thread-tell run"
    )
    parser.add_argument("--repeat", type=count, default=5, help="runs of each, best kept")
    parser.add_argument("--asyncio", action="store_true", help="plain asyncio instead of uvloop")
    return parser.parse_args(argv)  # each count >= 1: _args.count


if __name__ == "__main__":
    ns = parse()
    report = atomr.run(main(ns), use_uvloop=not ns.asyncio)
    json.dump(report, sys.stdout, indent=2)
    print()
