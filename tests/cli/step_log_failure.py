"""Run under `mpiexec -n 2`: `atomr train --distributed ARGS...` where rank
0's `--metrics` log fails to write its second step (a disk that filled up
mid-run): a failure of rank 0 alone, inside `fit`, while rank 1 trains on."""

from __future__ import annotations

import errno
import os
import sys
from typing import Any

import atomr.cli.train_command as train_command
from atomr.cli import main


class _FullDiskLater(train_command.JsonLinesLog):
    steps = 0

    def on_step(self, *args: Any, **kwargs: Any) -> None:
        type(self).steps += 1
        if type(self).steps == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path))
        super().on_step(*args, **kwargs)


if __name__ == "__main__":
    train_command.JsonLinesLog = _FullDiskLater  # type: ignore[misc]
    sys.exit(main(["train", "--distributed", *sys.argv[1:]]))
