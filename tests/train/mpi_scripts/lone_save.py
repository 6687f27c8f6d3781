"""Run under `mpiexec -n 2`: the pairing bug of a lone save. Both ranks of a
stage-1 `ShardedDataParallelTrainer` step once together; then rank 1 asks
`SaveCheckpoint` (collective: every process must ask it) while rank 0 asks
`Step`. Their collectives used to pair up (the save "succeeded" and no file
held the checkpoint); now the operation check refuses the pairing and both
fail with `CollectiveMismatchError` naming each rank's operation.

argv: OUT_DIR TIMEOUT (the collective's, seconds). Writes `rank{r}.json`:
the error's chain (type: message) and the seconds it took.
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


async def main(out: Path, timeout: float) -> None:
    dist = DistributedTrainConfig.from_environment(require=True, collective_timeout=timeout)
    options = ShardedOptions.for_job(dist, stage=1)
    config = TrainerConfig(OptimizerKind.adam(0.01), LossKind.CROSS_ENTROPY)
    report: dict[str, object] = {}
    async with ActorSystem() as system:
        trainer = await ShardedDataParallelTrainer.spawn(
            system, Mlp(SIZES, seed=0), cpu_devices(1), config, options
        )
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
    asyncio.run(main(Path(sys.argv[1]), float(sys.argv[2])))
