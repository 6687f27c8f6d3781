"""The supervisor strategy for device actors: decide by the kind of GpuError.

ContextPoisoned -> RESTART (a fresh context), OutOfMemory -> RESUME (the
context is fine, keep the state), Unrecoverable -> STOP (the device is gone),
anything else -> ESCALATE (the parent's parent decides).
"""

from __future__ import annotations

from atomr.accel.errors import ContextPoisoned, OutOfMemory, Unrecoverable
from atomr.actor import Directive, OneForOneStrategy

__all__ = ["device_decider", "device_supervisor_strategy"]


def device_decider(error: BaseException) -> Directive:
    """The directive for a device actor's failure.

    Args:
        error: what the child's handler raised.

    Returns:
        RESTART for ContextPoisoned, RESUME for OutOfMemory, STOP for
        Unrecoverable, ESCALATE for anything else.
    """
    if isinstance(error, ContextPoisoned):
        return Directive.RESTART
    if isinstance(error, OutOfMemory):
        return Directive.RESUME
    if isinstance(error, Unrecoverable):
        return Directive.STOP
    return Directive.ESCALATE


def device_supervisor_strategy(
    max_restarts: int | None = None, within: float | None = None
) -> OneForOneStrategy:
    """A OneForOneStrategy with ``device_decider``, for parents of device actors.

    Args:
        max_restarts: restarts allowed within ``within`` seconds (None: unlimited).
        within: the window in seconds (None: forever).

    Returns:
        The strategy.

    Raises:
        ValueError: negative max_restarts or within <= 0 (from OneForOneStrategy).
    """
    return OneForOneStrategy(max_restarts=max_restarts, within=within, decider=device_decider)
