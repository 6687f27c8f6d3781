"""Running a request's work on a device's worker thread, with request errors
coming back as a `Rejected` result instead of being raised.

`DeviceActor.on_device` turns an exception raised on the worker thread into
a `GpuError`; a bad request (bad input, a non-finite loss, an unreadable
checkpoint) must instead reach the asker as itself, in a `Failure`, without
restarting the actor. So the worker catches it there: `guarded` returns a
`Rejected`, and the actor answers `Failure(rejected.error)`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from atomr.train.core.errors import CheckpointError, InvalidBatchError, NonFiniteError

__all__ = ["REQUEST_ERRORS", "Rejected", "guarded"]

REQUEST_ERRORS: tuple[type[Exception], ...] = (
    InvalidBatchError,
    NonFiniteError,
    CheckpointError,
    OSError,
    ValueError,
    TypeError,
)
"""The one list of errors that mean "this request was bad" (bad input, a
non-finite loss, an unreadable checkpoint or path, an argument of the wrong
value or type): the actor answers `Failure(exc)` and is not restarted, and the
asker does not retry. Anything else fails the actor and its parent decides.
The accel layer knows nothing of training: a bare `DeviceActor` answering
`OnDevice` treats only ValueError and TypeError (and so `InvalidBatchError`)
as bad requests."""


@dataclass
class Rejected:
    """A device-side computation refused to apply (weights untouched).

    Attributes:
        error: why.
    """

    error: Exception


def guarded(
    fn: Callable[..., Any],
    *args: Any,
    errors: tuple[type[Exception], ...] = REQUEST_ERRORS,
) -> Any:
    """Run `fn(*args)` (on the worker thread), turning `errors` into a `Rejected`.

    NumPy's overflow and invalid-value warnings are silenced: non-finite
    results are detected and rejected explicitly.

    Args:
        fn: the device-side work.
        *args: its arguments.
        errors: the exception types to return as `Rejected` (default
            `REQUEST_ERRORS`).

    Returns:
        `fn`'s result, or `Rejected(exc)`.

    Raises:
        Exception: whatever `fn` raises that is not one of `errors`.
    """
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            return fn(*args)
    except errors as exc:
        return Rejected(exc)
