"""Run under `mpiexec -n 2`: the pairing bug of a lone save. Both ranks of a
trainer step once together; then rank 1 asks `SaveCheckpoint` (collective:
every process must ask it) while rank 0 asks `Step`. Their collectives used
to pair up; now the operation check refuses the pairing and both fail with
`CollectiveMismatchError` naming each rank's operation.

- sharded (a stage-1 `ShardedDataParallelTrainer`): the save's all-reduce
  met the step's reduce-scatter of the same length (the save "succeeded"
  and no file held the checkpoint): told apart by their kinds;
- data_parallel (a `DataParallelTrainer`): the save's agreement (an
  all-reduce of 2 float64) meets the step's scalars (an all-reduce of 2
  float64): the same kind, size and dtype, told apart by their purposes
  (`comm/purpose.py`).

argv: OUT_DIR TIMEOUT (the collective's, seconds) [STRATEGY: sharded, the
default, or data_parallel]. Writes `rank{r}.json`: the error's chain (type:
message) and the seconds it took.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

from atomr import ActorSystem
from atomr.accel import cpu_devices
from atomr.train import (
    DataParallelOptions,
    DataParallelTrainer,
    LossKind,
    Mlp,
    OptimizerKind,
    SaveCheckpoint,
    ShardedDataParallelTrainer,
    ShardedOptions,
    Step,
    TrainerConfig,
)
from atomr.train.comm.mpi.job import DistributedTrainConfig
from atomr.train.core import synthetic_classification

SIZES = [6, 8, 3]
X, Y = synthetic_classification(16, SIZES[0], SIZES[-1], seed=1)


def chain(error: BaseException | None) -> list[str]:
    """`error` and its causes, as "Type: message"."""
    seen: list[str] = []
    while error is not None and len(seen) < 8:
        seen.append(f"{type(error).__name__}: {error}")
        error = error.__cause__ or error.__context__
    return seen


async def main(out: Path, timeout: float, strategy: str) -> None:
    dist = DistributedTrainConfig.from_environment(require=True, collective_timeout=timeout)
    config = TrainerConfig(OptimizerKind.adam(0.01), LossKind.CROSS_ENTROPY)
    report: dict[str, object] = {}
    async with ActorSystem() as system:
        model, devices = Mlp(SIZES, seed=0), cpu_devices(1)
        if strategy == "sharded":
            options = ShardedOptions.for_job(dist, stage=1)
            trainer = await ShardedDataParallelTrainer.spawn(
                system, model, devices, config, options
            )
        else:
            dp_options = DataParallelOptions.for_job(dist)
            trainer = await DataParallelTrainer.spawn(system, model, devices, config, dp_options)
        await trainer.ask(Step(X, Y), timeout=4 * timeout)  # in step
        started = time.monotonic()
        message = SaveCheckpoint(str(out / "lone.ckpt")) if dist.rank == 1 else Step(X, Y)
        try:
            await trainer.ask(message, timeout=4 * timeout)
            report["errors"] = []
        except Exception as exc:
            report["errors"] = chain(exc)
        report["elapsed_s"] = time.monotonic() - started
    (out / f"rank{dist.rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    strategy = sys.argv[3] if len(sys.argv) > 3 else "sharded"
    asyncio.run(main(Path(sys.argv[1]), float(sys.argv[2]), strategy))
