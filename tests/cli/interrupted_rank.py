"""Run under `mpiexec -n 2`: `atomr train --distributed ARGS...` where rank 1
alone gets a SIGTERM at POINT (the first argument) of its start-up:
"loading" (as the command's parser is first imported), "load_dataset" (once
its data is loaded), "joining" (as the ranks exchange their options), or
"training_twice" (two SIGTERMs once the job has started: the first stops
every rank at the next epoch end, the second kills rank 1 at once)."""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import replace
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


SHORT_TIMEOUT_S = 10.0
"""The collective timeout of "training_twice" (120 s by default): rank 0 may
wait it out for the killed rank 1 (docs/distributed.md)."""


def _short_collective_timeout() -> None:
    import atomr.cli.run_args as run_args

    place = run_args.mpi_place
    run_args.mpi_place = lambda: replace(place(), collective_timeout=SHORT_TIMEOUT_S)


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
    elif point == "training_twice":
        _short_collective_timeout()
        train = command.train_epochs

        async def sigterm_twice_then_train(*args: Any, **kwargs: Any) -> Any:
            _sigterm()  # the run's handler: stop at the next epoch end
            _sigterm()  # the default action: killed
            return await train(*args, **kwargs)

        command.train_epochs = sigterm_twice_then_train  # type: ignore[assignment]
    else:  # joining
        agree = job.agree

        async def sigterm_then_agree(*args: Any) -> None:
            _sigterm()
            await agree(*args)

        job.agree = sigterm_then_agree  # type: ignore[assignment]


if __name__ == "__main__":
    if os.environ.get("PMI_RANK") == "1":
        _sigterm_at(sys.argv[1])
    elif sys.argv[1] == "training_twice":
        _short_collective_timeout()
    from atomr.cli import main

    sys.exit(main(["train", "--distributed", *sys.argv[2:]]))
