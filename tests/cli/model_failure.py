"""Run under `mpiexec -n 2`: `atomr train --distributed ARGS...` where rank
1 cannot build its model (out of memory) after the ranks agreed, before
the trainers' own agreement that every rank started: a failure of rank 1
alone, while rank 0 goes on to spawn its trainer."""

from __future__ import annotations

import errno
import os
import sys
from typing import Any

import atomr.cli.training_run as training_run
from atomr.cli import main

_model = training_run._model


def _no_memory_on_rank_1(run: Any, data: Any, history: Any) -> Any:
    if os.environ.get("PMI_RANK") == "1":
        raise OSError(errno.ENOMEM, os.strerror(errno.ENOMEM))
    return _model(run, data, history)


if __name__ == "__main__":
    training_run._model = _no_memory_on_rank_1  # type: ignore[assignment]
    sys.exit(main(["train", "--distributed", *sys.argv[1:]]))
