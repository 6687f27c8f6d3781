"""Run under `mpiexec -n 2`: a trainer's `spawn` that fails on one process only.

argv: OUT_DIR. For each case of `CASES` every rank spawns the trainer, and
rank 1's spawn fails: "start", its replica 1 (of 2) cannot start (its
`pre_start` raises, as a device that fails to start on one host);
"allocate", that replica raises `MemoryError` at its first message, which
builds its state on the device; "check", its own arguments are refused
before anything is spawned (data parallel: CPU and CUDA devices mixed;
ZeRO: more local devices than the layout can give a parameter to). The job's collectives time out after `TIMEOUT`
seconds, so a process left waiting fails with a `CollectiveTimeoutError`.
Each rank writes rank{r}.json: per case, its spawn's error (type, message,
notes; type None where it did not fail) and how many actors were left
running; then, under "after", the loss of one step of each strategy,
spawned again on every rank (the processes still take the same collectives).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from sharded_step_fault import CONFIG, SIZES, batch  # beside this script

from atomr import ActorSystem
from atomr.accel import cpu_devices
from atomr.testkit import Plan, inject_faults
from atomr.train import (
    DataParallelOptions,
    DataParallelTrainer,
    Mlp,
    ShardedDataParallelTrainer,
    ShardedOptions,
    Step,
)
from atomr.train.comm.mpi.job import DistributedTrainConfig
from atomr.train.data_parallel import ReplicaActor
from atomr.train.data_parallel.messages import GetDevice
from atomr.train.sharded import ShardedReplica
from atomr.train.sharded.messages import GetShardMemory

TIMEOUT = 10.0
CASES = (
    "data/start",
    "data/allocate",
    "data/check",
    "zero1/start",
    "zero2/allocate",
    "zero3/start",
    "zero3/check",
)
FAULTS: dict[str, tuple[str | type, str | type]] = {  # where, for ReplicaActor / ShardedReplica
    "start": ("pre_start", "pre_start"),
    "allocate": (GetDevice, GetShardMemory),  # the first message a replica gets at spawn
}


def trainer_and_options(
    strategy: str, dist: DistributedTrainConfig, replica: type | None
) -> tuple[Any, Any]:
    """The trainer class and its job options ("data", "zero1", "zero3")."""
    if strategy == "data":
        rc = replica or ReplicaActor
        return DataParallelTrainer, DataParallelOptions.for_job(dist, replica_class=rc)
    stage = int(strategy[-1])
    rc = replica or ShardedReplica
    return ShardedDataParallelTrainer, ShardedOptions.for_job(dist, stage=stage, replica_class=rc)


def devices(strategy: str, fault: str, failing: bool) -> list[Any]:
    """Two CPU devices, or on the failing rank of a "check" case, some it refuses."""
    if not (failing and fault == "check"):
        return list(cpu_devices(2))
    if strategy == "data":
        return ["cpu:0", "cuda:0"]  # CPU and CUDA mixed
    return list(cpu_devices(25))  # stage 3: a process's 24 values of the first layer, 25 ways


async def spawn_case(system: ActorSystem, dist: DistributedTrainConfig, case: str) -> dict:
    """One case: the spawn's error and the actors left running."""
    strategy, fault = case.split("/")
    failing = dist.rank == 1
    replica = None
    if failing and fault in FAULTS:
        plan = Plan()
        data = strategy == "data"
        base = ReplicaActor if data else ShardedReplica
        where = FAULTS[fault][0 if data else 1]
        replica = inject_faults(base, plan, {fault: where}, worker=1)
        plan.arm(fault, RuntimeError if fault == "start" else MemoryError)
    trainer, options = trainer_and_options(strategy, dist, replica)
    model = Mlp(SIZES, seed=1 + dist.rank)
    report: dict[str, Any] = {"type": None, "message": "", "notes": []}
    try:
        ref = await trainer.spawn(system, model, devices(strategy, fault, failing), CONFIG, options)
        await ref.stop()
    except Exception as exc:
        report = {
            "type": type(exc).__name__,
            "message": str(exc),
            "notes": getattr(exc, "__notes__", []),
        }
    report["actors"] = len(system.actors)
    return report


async def one_step(system: ActorSystem, dist: DistributedTrainConfig, strategy: str) -> float:
    """Spawn `strategy` on every rank and train one step: its loss."""
    trainer, options = trainer_and_options(strategy, dist, None)
    ref = await trainer.spawn(system, Mlp(SIZES, seed=1), cpu_devices(2), CONFIG, options)
    loss = (await ref.ask(Step(*batch(0)), timeout=60)).loss
    await ref.stop()
    return float(loss)


async def main(out: Path) -> None:
    dist = DistributedTrainConfig.from_environment(require=True, collective_timeout=TIMEOUT)
    reports: dict[str, Any] = {}
    async with ActorSystem() as system:
        for case in CASES:
            reports[case] = await spawn_case(system, dist, case)
        reports["after"] = {s: await one_step(system, dist, s) for s in ("data", "zero3")}
    (out / f"rank{dist.rank}.json").write_text(json.dumps(reports))


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
