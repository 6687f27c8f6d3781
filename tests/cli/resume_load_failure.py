"""Run under `mpiexec -n 2`: `atomr train --distributed ARGS...` where rank
1's copy of the `--resume` checkpoint is damaged after the ranks agreed on
it (its digest matched rank 0's) and before its trainer loads it: a failure
of rank 1 alone (`Job.load`), while rank 0 goes on to train.

`ATOMR_TEST_DAMAGED` names the ranks whose copy is damaged ("1" unless
set; "0,1": every rank's, a failure they all meet alike).
`ATOMR_TEST_COLLECTIVE_TIMEOUT` (seconds), when set, replaces the
collective's timeout (120 s)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from atomr.cli import main
from atomr.cli.job import Job
from atomr.train.comm.mpi.job import DistributedTrainConfig

_load = Job.load
_from_environment = DistributedTrainConfig.from_environment


async def _damaged_on_rank_1(self: Job, trainer: Any, path: Path, save: str | None) -> None:
    if os.environ.get("PMI_RANK") in os.environ.get("ATOMR_TEST_DAMAGED", "1").split(","):
        path.write_bytes(b"damaged after the agreement")
    await _load(self, trainer, path, save)


def _timeout(cls: Any, environ: Any = None, *, require: bool = False, **_: Any) -> Any:
    seconds = float(os.environ["ATOMR_TEST_COLLECTIVE_TIMEOUT"])
    return _from_environment(environ, require=require, collective_timeout=seconds)


if __name__ == "__main__":
    Job.load = _damaged_on_rank_1  # type: ignore[method-assign]
    if "ATOMR_TEST_COLLECTIVE_TIMEOUT" in os.environ:
        DistributedTrainConfig.from_environment = classmethod(_timeout)  # type: ignore[method-assign,assignment]
    sys.exit(main(["train", "--distributed", *sys.argv[1:]]))
