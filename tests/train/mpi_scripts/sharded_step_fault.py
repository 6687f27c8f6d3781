"""Run under `mpiexec -n 2`: a ZeRO step that fails on one process only.

argv: OUT_DIR FAULT. For each stage K of 1, 2, 3: 2 processes x 1 replica
train three steps; in the second, rank 1's replica fails as FAULT says
(`arm`, `atomr.testkit.inject_faults`): "forward" or "backward" raises in
that pass (stages 1 and 2: `compute_gradients`; stage 3: the second
layer's, past a collective of the step), "apply" in `apply_shard` (nothing
applied), "commit" refuses `CommitShard` twice (applied, not completed);
"evaluate" fails an `Evaluate` asked before the second step instead (stage 3:
the second layer's forward, past a collective; stages 1 and 2: its
`EvaluateShard`), and every step then trains. Every rank then asks
`GetTrainingState`, which completes an unfinished step first (a collective
then). Each rank writes rank{r}_stage{K}.json (the failing request's error
type and message, type None where it did not fail, and that step count) and
rank{r}_stage{K}.npy (its GetWeights after the third step).
"""

from __future__ import annotations

import asyncio
import json
import sys
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from atomr import ActorSystem
from atomr.accel import cpu_devices
from atomr.testkit import Plan, inject_faults
from atomr.train import (
    Evaluate,
    GetWeights,
    LossKind,
    Mlp,
    OptimizerKind,
    ShardedDataParallelTrainer,
    ShardedOptions,
    Step,
    TrainerConfig,
)
from atomr.train.comm.mpi.job import DistributedTrainConfig
from atomr.train.core import GetTrainingState, synthetic_classification
from atomr.train.data_parallel.messages import EvaluateShard
from atomr.train.sharded import ShardedReplica
from atomr.train.sharded.messages import BackwardLayer, CommitShard, ForwardLayer

SIZES = [6, 7, 3]
CONFIG = TrainerConfig(OptimizerKind.sgd(0.1), LossKind.CROSS_ENTROPY)
STAGES = (1, 2, 3)
FAILING_STEP = 1
PHASES: dict[str, str | type] = {
    "compute": "compute_gradients",
    "forward": ForwardLayer,
    "backward": BackwardLayer,
    "apply": "apply_shard",
    "commit": CommitShard,
    "evaluate": EvaluateShard,
}


def arm(plan: Plan, fault: str, stage: int) -> None:
    """Make rank 1's replica fail as `fault` says (module docstring)."""
    if fault == "commit":
        plan.arm(fault, RuntimeError, times=2)  # the step asks twice
    elif fault == "apply" or (fault == "evaluate" and stage < 3):
        plan.arm(fault, RuntimeError)
    elif stage < 3:
        plan.arm("compute", RuntimeError)
    else:
        plan.arm("forward" if fault == "evaluate" else fault, RuntimeError, skip=1)


def batch(step: int) -> tuple[np.ndarray, np.ndarray]:
    return synthetic_classification(8, SIZES[0], SIZES[-1], seed=300 + step)


async def run_stage(
    system: ActorSystem, dist: DistributedTrainConfig, stage: int, out: Path, fault: str
) -> None:
    plan = Plan()
    replica = inject_faults(ShardedReplica, plan, PHASES)
    options = ShardedOptions.for_job(
        dist, stage=stage, replica_class=replica if dist.rank == 1 else ShardedReplica
    )
    model = Mlp(SIZES, seed=1)
    trainer = await ShardedDataParallelTrainer.spawn(system, model, cpu_devices(1), CONFIG, options)
    report: dict[str, Any] = {}
    for step in range(3):
        if step == FAILING_STEP:
            arm(plan, fault, stage)
            if fault == "evaluate":
                report = await asked(trainer, Evaluate(*batch(step)))
        step_report = await asked(trainer, Step(*batch(step)))
        if step_report["type"] is not None:
            report = step_report
    await finish(trainer, dist, stage, out, report)


async def asked(trainer: Any, message: Any) -> dict[str, Any]:
    """Ask `message`: its error's type and message (type None: answered),
    and then the trainer's step count."""
    report: dict[str, Any] = {"type": None, "message": ""}
    try:
        await trainer.ask(message, timeout=60)
    except Exception as exc:
        report = {"type": type(exc).__name__, "message": str(exc)}
    report["steps"] = (await trainer.ask(GetTrainingState(), timeout=60)).step
    return report


async def finish(
    trainer: Any, dist: DistributedTrainConfig, stage: int, out: Path, report: dict[str, Any]
) -> None:
    """Write this rank's weights and report for `stage`, then stop the trainer."""
    np.save(out / f"rank{dist.rank}_stage{stage}.npy", await trainer.ask(GetWeights(), timeout=60))
    (out / f"rank{dist.rank}_stage{stage}.json").write_text(json.dumps(report))
    await trainer.stop()


async def main(out: Path, stage_run: Any) -> None:
    """Every stage in turn, each by `stage_run(system, dist, stage, out)`."""
    dist = DistributedTrainConfig.from_environment(require=True, collective_timeout=30.0)
    async with ActorSystem() as system:
        for stage in STAGES:
            await stage_run(system, dist, stage, out)


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), partial(run_stage, fault=sys.argv[2])))
