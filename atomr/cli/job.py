"""`Job`: how the processes of an `atomr train` run cooperate, and
`open_job`, which joins the ranks of a `--distributed` run before anything
is built (their collective, and their agreement on the options)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from atomr.actor import ActorRef
from atomr.cli.agreement import check_agreement
from atomr.cli.errors import CliError
from atomr.train import CheckpointError, LoadCheckpoint
from atomr.train.comm.mpi.collective import MpiCollective
from atomr.train.comm.mpi.errors import CollectiveError

if TYPE_CHECKING:
    from atomr.cli.run_config import RunConfig

__all__ = ["Job", "MpiJob", "open_job"]


class Job:
    """How the processes of a run cooperate; a single process is a job of one.

    Attributes:
        is_root: True where this process writes files.
        agree_to_stop: None (a single process stops between any two steps),
            or, for an MPI job, `(requested) -> all stop` at an epoch's end.
        collective: the collective joining the processes (None: one process).
    """

    is_root = True
    agree_to_stop: Callable[[bool], Awaitable[bool]] | None = None
    collective: Any = None

    async def load(self, trainer: ActorRef, path: Path) -> None:
        """Load the checkpoint to resume from.

        Raises:
            CliError: the trainer refused it (corrupted, another model).
        """
        try:
            await trainer.ask(LoadCheckpoint(str(path)), timeout=600.0)
        except (CheckpointError, OSError) as exc:
            raise CliError(f"--resume: {exc}") from None

    def abort(self, error: BaseException) -> None:
        """Training failed with `error`; a single process has nobody to tell."""
        del error

    @contextmanager
    def aborting(self) -> Iterator[None]:
        """Inside, an exception is passed to `abort` (which ends an MPI job
        after a collective failure), then raised."""
        try:
            yield
        except Exception as exc:
            self.abort(exc)
            raise


class MpiJob(Job):
    """The ranks of `atomr train --distributed`, joined by an `MpiCollective`."""

    def __init__(self, collective: Any, is_root: bool) -> None:
        self.collective = collective
        self.is_root = is_root
        self.agree_to_stop = self._agree

    async def _agree(self, requested: bool) -> bool:
        total = await self.collective.all_reduce([np.array([1.0 if requested else 0.0])])
        return bool(np.asarray(total).reshape(-1)[0] > 0)

    def abort(self, error: BaseException) -> None:
        """After a collective failure (a rank died or timed out), abort the
        whole MPI job with exit code 2 and the error as the message, on one
        line (MPI's error stacks span several); any other error is left to
        the caller."""
        if isinstance(error, CollectiveError):
            self.collective.abort(2, f"{type(error).__name__}: {' '.join(str(error).split())}")


async def open_job(run: RunConfig) -> Job:
    """The job of `run`: a job of one, or, with `--distributed`, this rank's
    place in the MPI job, once every rank has checked that they were all
    given the same options (`agreement.check_agreement`).

    Collective under `--distributed`: every rank calls it at the same point,
    before building anything.

    Raises:
        CliError: the ranks were given different options (exit status 2, on
            every rank); mpi4py is missing (exit status 1); MPI disagrees
            with the launcher's variables.
    """
    if run.dist is None:
        return Job()
    try:
        collective = MpiCollective.from_config(run.dist)
    except ImportError:
        raise CliError("--distributed needs mpi4py: pip install -e '.[mpi]'", 1) from None
    except ValueError as exc:
        raise CliError(f"--distributed: {exc}") from None
    job = MpiJob(collective, run.dist.is_root)
    with job.aborting():
        await check_agreement(collective, run)
    return job
