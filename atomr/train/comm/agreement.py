"""`agree_on_failure`: the processes of a job learn together whether any of
them failed a step of a shared task (a save, a load, a sharded update), so
that a failure anywhere fails the task everywhere instead of leaving the
others waiting at their next collective, or going on with another state."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import numpy as np

from atomr.train.comm.collective import Collective
from atomr.train.core.errors import CheckpointError

T = TypeVar("T")

__all__ = ["agree_on_failure", "agreed"]


def checkpoint_not_saved(who: str, what: str) -> Exception:
    """The error of a save that failed on other processes (`who`)."""
    return CheckpointError(
        f"{who} failed to {what}; the checkpoint was not saved (the previous one is untouched)"
    )


async def agree_on_failure(
    processes: Collective | None,
    error: BaseException | None,
    what: str,
    value: float = 0.0,
    *,
    others: Callable[[str, str], Exception] = checkpoint_not_saved,
    place: tuple[int, int] | None = None,
) -> float:
    """Every process learns whether any failed to do `what`; `value` is
    summed over them on the way (one process's value: a broadcast).

    Args:
        processes: joins the job's processes (None: a job of one).
        error: this process's failure, or None.
        what: what was being done, for the others' message ("write the index").
        value: this process's contribution to the returned sum.
        others: makes the error of a process that did not fail, from who
            did ("1 other process(es)", or with `place` "process rank 1")
            and `what` (default: a `CheckpointError` saying the save failed).
        place: `(rank, count)`: this process's rank in a job of `count`
            processes. Given, the sum carries one flag per process, so the
            others' error names the ranks that failed, and this process's
            own error gets a note naming its rank.

    Returns:
        The sum of `value` over the processes.

    Raises:
        BaseException: this process's own `error`.
        Exception: `others(who, what)` where only other processes failed.
        Exception: the collective's own error (nothing agreed).
    """
    if processes is None:
        if error is not None:
            raise error
        return value
    flags = np.zeros(0 if place is None else place[1])
    if place is not None and error is not None:
        flags[place[0]] = 1.0
    shared = np.concatenate([[0.0 if error is None else 1.0, value], flags])
    total = np.asarray(await processes.all_reduce([shared])).reshape(-1)
    if error is not None:
        if place is not None:
            error.add_note(f"on process rank {place[0]}: the others were told it failed to {what}")
        raise error
    if total[0] > 0:
        raise others(_who_failed(total[0], total[2:]), what)
    return float(total[1])


def _who_failed(count: float, flags: np.ndarray) -> str:
    """Who failed, for the others' message: the ranks whose flag is set, or,
    without flags, how many processes."""
    if flags.size == 0:
        return f"{int(count)} other process(es)"
    ranks = [str(r) for r in np.flatnonzero(flags)]
    return f"process rank{'s' if len(ranks) > 1 else ''} {', '.join(ranks)}"


async def agreed(
    processes: Collective | None,
    what: str,
    work: Callable[[], Awaitable[T]] | None,
    *,
    others: Callable[[str, str], Exception] = checkpoint_not_saved,
) -> T | None:
    """Do this process's part of `what` (`work`; None: nothing here), then
    agree with the others whether it failed anywhere (`agree_on_failure`).

    Returns:
        What `work` returned (None without work).

    Raises:
        Exception: as `agree_on_failure`: this process's own error, another
            process's failure (`others`), or the collective's.
    """
    error: Exception | None = None
    result: T | None = None
    if work is not None:
        try:
            result = await work()
        except Exception as exc:  # every process hears of it
            error = exc
    await agree_on_failure(processes, error, what, others=others)
    return result
