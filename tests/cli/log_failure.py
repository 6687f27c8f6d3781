"""Run under `mpiexec -n 2`: `atomr train --distributed ARGS...` where rank
0's `--metrics` log cannot be opened although its probe passed (a disk that
filled up in between), after the ranks agreed on their options."""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path
from typing import Any

import atomr.cli.train_command as train_command
from atomr.cli import main


class _FullDisk(train_command.JsonLinesLog):
    def __init__(self, path: str | Path, *args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


if __name__ == "__main__":
    train_command.JsonLinesLog = _FullDisk  # type: ignore[misc]
    sys.exit(main(["train", "--distributed", *sys.argv[1:]]))
