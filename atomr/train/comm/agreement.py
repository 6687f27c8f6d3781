"""`agree_on_failure`: the processes of a job learn together whether any of
them failed a step of a shared task (a save), so that a failure anywhere
fails the task everywhere instead of leaving the others waiting at their
next collective."""

from __future__ import annotations

import numpy as np

from atomr.train.comm.collective import Collective
from atomr.train.core.errors import CheckpointError

__all__ = ["agree_on_failure"]


async def agree_on_failure(
    processes: Collective | None, error: Exception | None, what: str, value: float = 0.0
) -> float:
    """Every process learns whether any failed to do `what`; `value` is
    summed over them on the way (one process's value: a broadcast).

    Args:
        processes: joins the job's processes (None: a job of one).
        error: this process's failure, or None.
        what: what was being done, for the others' message ("write the index").
        value: this process's contribution to the returned sum.

    Returns:
        The sum of `value` over the processes.

    Raises:
        Exception: this process's own `error`.
        CheckpointError: another process failed (the previous checkpoint is
            untouched).
    """
    if processes is None:
        if error is not None:
            raise error
        return value
    shared = np.array([0.0 if error is None else 1.0, value], dtype=np.float64)
    total = np.asarray(await processes.all_reduce([shared])).reshape(-1)
    if error is not None:
        raise error
    if total[0] > 0:
        raise CheckpointError(
            f"{int(total[0])} other process(es) failed to {what}; the checkpoint was not "
            "saved (the previous one is untouched)"
        )
    return float(total[1])
