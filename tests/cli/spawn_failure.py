"""Run under `mpiexec -n 2`: `atomr train --distributed ARGS...` where rank 1
builds a wider model than rank 0 behind the options' check (as a rank of
another build would), so the trainers' initial weight broadcast fails. The
collectives time out after 2 s; the job must end with one line, no traceback."""

from __future__ import annotations

import os
import sys
from typing import Any

import atomr.cli.training_run as training_run
from atomr.cli import main
from atomr.train import Mlp
from atomr.train.comm.mpi.job import DistributedTrainConfig

_from_environment = DistributedTrainConfig.from_environment
_model = training_run._model


def _quick(cls: Any, environ: Any = None, *, require: bool = False, **_: Any) -> Any:
    return _from_environment(environ, require=require, collective_timeout=2.0)


def _wider_on_rank_1(run: Any, data: Any, history: Any) -> Any:
    model = _model(run, data, history)
    if os.environ.get("PMI_RANK") != "1":
        return model
    sizes = list(model.sizes)
    sizes[1] += 3
    return Mlp(sizes, activation=run.activation, seed=run.seed)


if __name__ == "__main__":
    DistributedTrainConfig.from_environment = classmethod(_quick)  # type: ignore[method-assign,assignment]
    training_run._model = _wider_on_rank_1  # type: ignore[assignment]
    sys.exit(main(["train", "--distributed", *sys.argv[1:]]))
