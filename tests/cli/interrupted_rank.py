"""Run under `mpiexec -n 2`: `atomr train --distributed ARGS...` where rank 1
alone gets a SIGTERM at POINT (the first argument) of its start-up:
"loading" (as the command's parser is first imported), "load_dataset" (once
its data is loaded), or "joining" (as the ranks exchange their options)."""

from __future__ import annotations

import os
import signal
import sys
from importlib.abc import MetaPathFinder
from typing import Any


def _sigterm() -> None:
    os.kill(os.getpid(), signal.SIGTERM)  # handled before os.kill returns


class _WhileLoading(MetaPathFinder):
    """Sends the SIGTERM as the parser is first imported."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> None:
        if name == "atomr.cli.parser":
            sys.meta_path.remove(self)
            _sigterm()


def _sigterm_at(point: str) -> None:
    if point == "loading":
        sys.meta_path.insert(0, _WhileLoading())
        return
    import atomr.cli.job as job
    import atomr.cli.train_command as command

    if point == "load_dataset":
        load = command.load_dataset

        def loaded_then_sigterm(*args: Any) -> Any:
            data = load(*args)
            _sigterm()
            return data

        command.load_dataset = loaded_then_sigterm  # type: ignore[assignment]
    else:  # joining
        agree = job.agree

        async def sigterm_then_agree(*args: Any) -> None:
            _sigterm()
            await agree(*args)

        job.agree = sigterm_then_agree  # type: ignore[assignment]


if __name__ == "__main__":
    if os.environ.get("PMI_RANK") == "1":
        _sigterm_at(sys.argv[1])
    from atomr.cli import main

    sys.exit(main(["train", "--distributed", *sys.argv[2:]]))
