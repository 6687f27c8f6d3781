"""`Job`: how the processes of an `atomr train` run cooperate; `open_job`,
which joins the ranks of a `--distributed` run before anything is built
(their collective, and their agreement on the options); and
`stop_every_rank`, with which a rank that failed before that tells the
others."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np

import atomr
from atomr.actor import ActorRef
from atomr.cli.agreement import agree, none_failed
from atomr.cli.errors import CliError, reported_as
from atomr.cli.interrupt import interruption, signals_kill
from atomr.cli.resume import check_unchanged
from atomr.cli.run_args import mpi_place
from atomr.train import CheckpointError, LoadCheckpoint
from atomr.train.comm.mpi.collective import MpiCollective
from atomr.train.comm.mpi.errors import CollectiveError
from atomr.train.comm.mpi.job import DistributedTrainConfig

__all__ = ["Job", "MpiJob", "open_job", "stop_every_rank"]


class Job:
    """How the processes of a run cooperate; a single process is a job of one.

    Attributes:
        is_root: True where this process writes files.
        agree_to_stop: None (a single process stops between any two steps),
            or, for an MPI job, `(requested) -> all stop`, which `fit` asks
            before the first step and at an epoch's end.
        collective: the collective joining the processes (None: one process).
    """

    is_root = True
    agree_to_stop: Callable[[bool], Awaitable[bool]] | None = None
    collective: Any = None

    async def load(self, trainer: ActorRef, path: Path, save: str | None) -> None:
        """Load the checkpoint to resume from, the save `save` (its
        `save_digest`, which the run was planned from; None: not checked).

        Raises:
            CliError: the trainer refused it (corrupted, another model), or
                it is no longer that save (`check_unchanged`).
        """
        try:
            await trainer.ask(LoadCheckpoint(str(path)), timeout=600.0)
        except (CheckpointError, OSError) as exc:
            raise CliError(f"--resume: {exc}") from None
        if save is not None:
            check_unchanged(path, save)

    async def none_failed(self, error: Exception | None) -> None:
        """Every process learns whether any failed a step they all take
        before training (`error`: this one's failure, or None); one process
        has nobody to tell.

        Raises:
            Exception: `error`.
        """
        if error is not None:
            raise error

    def abort(self, error: BaseException, alone: bool = False) -> None:
        """Training failed with `error`; a single process has nobody to tell."""
        del error, alone

    def failed(self) -> None:
        """This process's failure is reported (its outputs are written and its
        error is about to be printed); a single process has nobody to tell."""

    @contextmanager
    def aborting(self, alone: bool = False) -> Iterator[None]:
        """Inside, an exception is passed to `abort` (which ends an MPI job
        after a collective failure; `alone`: any other failure is this
        rank's alone, and `failed` tells the others of it), then raised."""
        try:
            yield
        except Exception as exc:
            self.abort(exc, alone)
            raise


class MpiJob(Job):
    """The ranks of `atomr train --distributed`, joined by an `MpiCollective`."""

    def __init__(self, collective: Any, is_root: bool) -> None:
        self.collective = collective
        self.is_root = is_root
        self.agree_to_stop = self._agree
        self._alone = False  # this rank failed on its own: `failed` tells the others

    async def none_failed(self, error: Exception | None) -> None:
        """Every rank learns whether any failed a step they all take before
        training (`error`: this one's failure, or None), so that all stop
        together (`agreement.none_failed`). Collective.

        Raises:
            CliError: the line every rank raises, naming each failed one.
            Exception: `error` itself, where it is a bug (`_raised_alike`).
            CollectiveError: a rank never joined (the job is aborted).
        """
        with self.aborting(), _raised_alike(error):
            await none_failed(self.collective, None if error is None else _as_line(error))

    async def _agree(self, requested: bool) -> bool:
        total = await self.collective.all_reduce([np.array([1.0 if requested else 0.0])])
        return bool(np.asarray(total).reshape(-1)[0] > 0)

    def abort(self, error: BaseException, alone: bool = False) -> None:
        """After a collective failure (a rank died or timed out), abort the
        whole MPI job with exit code 2 and the error as the message, on one
        line (MPI's error stacks span several). Any other error is left to
        the caller; `alone`: it is this rank's alone (any failure after the
        ranks agreed: starting the trainer, loading the `--resume`
        checkpoint, in `fit`), so `failed` will tell the other ranks."""
        if isinstance(error, CollectiveError):
            self.collective.abort(2, f"{type(error).__name__}: {' '.join(str(error).split())}")
        self._alone = self._alone or alone

    def failed(self) -> None:
        """This rank's failure is reported (its outputs written, its error
        about to be printed): if it was this rank's alone, tell the others
        (`MpiCollective.report_failure`), so that their collective fails at
        once naming this rank, and they end the job, instead of waiting out
        the collective's timeout (120 s). Told only now, because their abort
        ends this process too: its own error must be out first."""
        if self._alone:
            self._alone = False
            self.collective.report_failure()


async def open_job(dist: DistributedTrainConfig | None, mine: Mapping[str, Any] | CliError) -> Job:
    """The job of a run: a job of one, or, under `--distributed` (`dist`),
    this rank's place in the MPI job, once every rank has told the others
    whether it failed and checked that they were all given the same options
    (`agreement.agree`).

    Collective under `--distributed`: every rank calls it at the same point,
    before building anything.

    Args:
        dist: this rank's place in the MPI job, or None (one process).
        mine: this rank's `agreement.shared_options`, or the error it failed
            with before (raised on every rank, naming this one).

    Raises:
        CliError: a rank failed before (its exit status, on every rank); the
            ranks were given different options (exit status 2, on every
            rank); mpi4py is missing (exit status 1; a rank that failed
            raises its own error); MPI disagrees with the launcher's variables.
    """
    if dist is None:
        if isinstance(mine, CliError):
            raise mine
        return Job()
    try:
        collective = MpiCollective.from_config(dist)
    except (ImportError, ValueError) as exc:
        if isinstance(mine, CliError):
            raise mine from None
        if isinstance(exc, ImportError):
            raise CliError("--distributed needs mpi4py: pip install -e '.[mpi]'", 1) from None
        raise CliError(f"--distributed: {exc}") from None
    job = MpiJob(collective, dist.is_root)
    with job.aborting():
        await agree(collective, mine)
    return job


def stop_every_rank(distributed: bool, error: Exception | KeyboardInterrupt) -> None:
    """This process failed with `error` before the ranks agreed, or was
    interrupted (a Ctrl-C, or SIGTERM's `Terminated`): when it is a rank of
    a `--distributed` job, tell every rank (`open_job` with the error) and
    raise what they all raise; else return (the caller raises `error`, as
    does a process that cannot find its place in the job). An interrupted
    rank waits for the others there as a failed one does, but a second
    signal meanwhile ends it at once (`signals_kill`).

    Args:
        distributed: the command asked for `--distributed`.
        error: what this process failed with, or its interrupt.

    Raises:
        CliError: the line every rank prints, naming this one (its exit
            status that of `error`: 1 where `error` is not a `CliError`;
            an interrupt's, 143 or 130: `interruption`).
        Exception: `error` itself, after the other ranks were told, where
            it is a bug (not `reported_as` one line): its traceback.
    """
    if not distributed:
        return
    try:
        dist = mpi_place()
    except CliError:
        return
    interrupted = isinstance(error, KeyboardInterrupt)
    with signals_kill() if interrupted else nullcontext(), _raised_alike(error):
        atomr.run(open_job(dist, _as_line(error)))


def _as_line(error: Exception | KeyboardInterrupt) -> CliError:
    """What the other ranks are told of `error`: the line it is reported as
    (an interrupt's: `interruption`), or, for a bug, its type and message
    (exit status 1)."""
    if isinstance(error, KeyboardInterrupt):
        return CliError(*interruption(error))
    return reported_as(error) or CliError(f"{type(error).__name__}: {error}", 1)


@contextmanager
def _raised_alike(error: Exception | KeyboardInterrupt | None) -> Iterator[None]:
    """Around telling the other ranks of `error` (this rank's failure or
    interrupt, or None): the `CliError` every rank then raises passes,
    except on the rank whose `error` is a bug, which raises `error` itself
    (its traceback)."""
    try:
        yield
    except CliError:
        if isinstance(error, Exception) and reported_as(error) is None:
            raise error from None
        raise
