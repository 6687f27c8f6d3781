"""A supervised worker pool: a round-robin pool of workers that sometimes crash.

Workers raise on "poisoned" jobs; the pool's supervisor strategy restarts
them (at most 10 times a minute), the asker of a poisoned job gets the error,
and every other job is answered.

Run: python examples/worker_pool.py   (prints "ok=17 failed=3 restarts=3")
"""

from __future__ import annotations

import argparse
import asyncio
import logging

import atomr
from atomr import Actor, ActorSystem, OneForOneStrategy, Props, RoundRobinPool


class JobFailed(Exception):
    """A worker could not do the job."""


class Worker(Actor):
    restarts = 0  # counted across instances, to show supervision at work

    def post_restart(self, error: BaseException) -> None:
        Worker.restarts += 1

    async def receive(self, job: int) -> int:
        await asyncio.sleep(0.001)  # pretend to work
        if job % 7 == 3:
            raise JobFailed(f"job {job} is poisoned")
        return job * job


async def main(jobs: int = 20) -> tuple[int, int]:
    strategy = OneForOneStrategy(max_restarts=10, within=60.0)
    async with ActorSystem("pool") as system:
        pool = system.spawn(RoundRobinPool(4, Props(Worker), strategy), name="workers")
        results = await asyncio.gather(
            *(pool.ask(j, timeout=5) for j in range(jobs)), return_exceptions=True
        )
    ok = [r for r in results if not isinstance(r, BaseException)]
    failed = [r for r in results if isinstance(r, JobFailed)]
    print(f"ok={len(ok)} failed={len(failed)} restarts={Worker.restarts}")
    print(f"sum of squares of good jobs: {sum(ok)}")
    return len(ok), len(failed)


if __name__ == "__main__":
    argparse.ArgumentParser(  # --help prints the docstring; it takes no options
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args()
    logging.getLogger("atomr").setLevel(logging.ERROR)  # the crashes are expected here
    atomr.run(main())
