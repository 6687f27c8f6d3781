"""Benchmark: `MpiCollective.all_reduce` against mpi4py's bare `Allreduce`, and
the hierarchical data-parallel step at 2 processes against 1. Prints JSON.

Run it as a plain script; it launches `mpiexec` itself (loopback, hard
timeouts) and gathers what rank 0 of each job measured:

    python benchmarks/mpi_allreduce.py [--repeat 15] [--max-mb 64] [--steps 10]

Figures:

- `allreduce`: for buffers of 1 KB .. 64 MB (float32), on 2 processes, the
  seconds of one in-place sum through `await coll.all_reduce(buf)` (an
  `Iallreduce` started and tested on the event loop's thread, its timeout
  enforced) and of a bare
  `comm.Allreduce(MPI.IN_PLACE, buf)` called directly; also
  `atomr_unchecked_all_reduce_s`, the same through an
  `MpiCollective(check_order=False)` (no operation check: `_order.py`).
  Each round times a block of back-to-back calls of each (after a barrier;
  which one goes first rotates between rounds); the figure is the median
  over the rounds of the per-call mean. `ratio` = atomr / bare (target <=
  1.10 at 1 MB and above), `unchecked_ratio` = unchecked atomr / bare.
- `dp_step`: one `Step` of a `DataParallelTrainer` spawned with
  `DataParallelOptions.for_job`, on the same global batch,
  with 1 process x 2 local devices and with 2 processes x 2 local devices;
  `ratio` = 2-process time / 1-process time. On a machine with fewer cores
  than replicas the processes share cores, so this measures overhead, not
  speed-up.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from _args import count

from atomr.train.comm.mpi.launch import run_mpiexec

DP_SIZES = [256, 512, 512, 10]
DP_BATCH = 512


# -- rank side ------------------------------------------------------------------


def _time_bare(comm: Any, in_place: Any, buf: np.ndarray, reps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(reps):
        comm.Allreduce(in_place, buf)
    return (time.perf_counter() - t0) / reps


async def _time_ours(coll: Any, buf: np.ndarray, reps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(reps):
        await coll.all_reduce(buf)
    return (time.perf_counter() - t0) / reps


async def _allreduce_rank(out: Path, repeat: int, max_mb: int) -> None:
    from mpi4py import MPI

    from atomr.train.comm.mpi.collective import MpiCollective

    comm = MPI.COMM_WORLD
    coll = MpiCollective(timeout=120.0)
    unchecked = MpiCollective(timeout=120.0, check_order=False)
    rows = []
    nbytes = 1024
    while nbytes <= max_mb * 1024 * 1024:
        buf = np.ones(nbytes // 4, dtype=np.float32)
        # calls per timed block: ~4 MB of traffic for small buffers, >= 16 MB
        # (and >= 2 calls) from 1 MB up, so one descheduling of a rank by the
        # shared machine weighs less on a block
        if nbytes < (1 << 20):
            reps = max(3, min(200, (4 << 20) // nbytes))
        else:
            reps = max(2, (16 << 20) // nbytes)
        times: list[list[float]] = [[], [], []]  # bare, atomr, atomr unchecked
        for _ in range(2):  # warm-up every path
            comm.Allreduce(MPI.IN_PLACE, buf)
            await coll.all_reduce(buf)
            await unchecked.all_reduce(buf)
        for k in range(repeat):  # interleaved rounds, rotating which goes first
            for which in (k % 3, (k + 1) % 3, (k + 2) % 3):
                comm.Barrier()
                if which == 0:
                    times[0].append(_time_bare(comm, MPI.IN_PLACE, buf, reps))
                else:
                    path = coll if which == 1 else unchecked
                    times[which].append(await _time_ours(path, buf, reps))
        bare, ours, plain = (statistics.median(t) for t in times)
        rows.append(
            {
                "bytes": nbytes,
                "mpi4py_allreduce_s": bare,
                "atomr_all_reduce_s": ours,
                "atomr_unchecked_all_reduce_s": plain,
                "ratio": ours / bare,
                "unchecked_ratio": plain / bare,
            }
        )
        buf.fill(1.0)
        await coll.all_reduce(buf)
        assert float(buf[0]) == comm.Get_size(), "wrong sum"
        nbytes *= 4 if nbytes < (1 << 20) else 2
    coll.close()
    unchecked.close()
    if comm.Get_rank() == 0:
        out.write_text(json.dumps({"processes": comm.Get_size(), "rows": rows}))


async def _dp_rank(out: Path, steps: int) -> None:
    from atomr import ActorSystem
    from atomr.accel import cpu_devices
    from atomr.train import (
        DataParallelOptions,
        DataParallelTrainer,
        LossKind,
        Mlp,
        OptimizerKind,
        Step,
        TrainerConfig,
    )
    from atomr.train.comm.mpi import DistributedTrainConfig
    from atomr.train.core import synthetic_classification

    dist = DistributedTrainConfig.from_environment(require=True, collective_timeout=120.0)
    config = TrainerConfig(OptimizerKind.sgd(0.01), LossKind.CROSS_ENTROPY)
    x, y = synthetic_classification(DP_BATCH, DP_SIZES[0], DP_SIZES[-1], seed=1)
    options = DataParallelOptions.for_job(dist)
    async with ActorSystem() as system:
        trainer = await DataParallelTrainer.spawn(
            system, Mlp(DP_SIZES, seed=0), cpu_devices(2), config, options
        )
        for _ in range(2):
            await trainer.ask(Step(x, y), timeout=600)
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            stats = await trainer.ask(Step(x, y), timeout=600)
            times.append(time.perf_counter() - t0)
        if dist.rank == 0:
            out.write_text(
                json.dumps(
                    {
                        "processes": dist.world_size,
                        "step_s": statistics.median(times),
                        "loss": stats.loss,
                    }
                )
            )


# -- orchestration ----------------------------------------------------------------


def _launch(n: int, args: list[str], timeout: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        program = [sys.executable, os.path.abspath(__file__), *args, "--out", str(out)]
        done = run_mpiexec(n, program, timeout=timeout, capture=True)
        if done.returncode != 0 or not out.exists():
            raise SystemExit(
                f"benchmark job failed (exit {done.returncode}):\n{done.stdout}\n{done.stderr}"
            )
        result: dict[str, Any] = json.loads(out.read_text())
        return result


def main() -> None:
    """Parse arguments; run a rank's part, or launch the jobs and print JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=count, default=15, help="interleaved rounds per size")
    parser.add_argument("--max-mb", type=count, default=64, help="largest buffer in MB")
    parser.add_argument("--steps", type=count, default=10, help="timed data-parallel steps")
    parser.add_argument("--no-dp", action="store_true", help="only the all-reduce figures")
    parser.add_argument("--role", choices=["allreduce", "dp"], help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "allreduce":
        asyncio.run(_allreduce_rank(args.out, args.repeat, args.max_mb))
        return
    if args.role == "dp":
        asyncio.run(_dp_rank(args.out, args.steps))
        return
    common = ["--repeat", str(args.repeat), "--max-mb", str(args.max_mb)]
    allreduce = _launch(2, ["--role", "allreduce", *common], timeout=400)
    at_least_1mb = [r["ratio"] for r in allreduce["rows"] if r["bytes"] >= 1 << 20]
    report: dict[str, Any] = {
        "machine": {
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "numpy": np.__version__,
        },
        "allreduce": allreduce,
        "allreduce_max_ratio_at_1mb_and_above": max(at_least_1mb) if at_least_1mb else None,
    }
    if not args.no_dp:
        dp_args = ["--role", "dp", "--steps", str(args.steps)]
        one = _launch(1, dp_args, timeout=300)
        two = _launch(2, dp_args, timeout=300)
        report["dp_step"] = {
            "model": DP_SIZES,
            "global_batch": DP_BATCH,
            "local_devices": 2,
            "processes_1_step_s": one["step_s"],
            "processes_2_step_s": two["step_s"],
            "ratio": two["step_s"] / one["step_s"],
            "loss_1": one["loss"],
            "loss_2": two["loss"],
        }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
