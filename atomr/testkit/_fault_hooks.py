"""The hooks `inject_faults` puts on a worker class: a method or `receive`
that consults a `Plan` first, and `Armed`, one armed phase (`faults.py` is
the public side: `Plan`, `inject_faults`)."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Armed", "ErrorSpec", "hooked", "hooked_receive"]

ErrorSpec = type[BaseException] | BaseException | None
"""What a phase raises when it fires: an exception class or instance, or
None (a delay only)."""


@dataclass
class Armed:
    """One armed phase: what it does when it fires, and how often still."""

    error: ErrorSpec
    times: int
    delay: float
    after: bool
    skip: int

    def raise_error(self, phase: str) -> None:
        """Raise the armed error (nothing when only a delay was armed)."""
        if self.error is None:
            return
        if isinstance(self.error, BaseException):
            raise self.error
        raise self.error(f"injected failure: {phase}")


Taker = Callable[[Any, list[str]], "tuple[str, Armed] | None"]


def hooked(original: Callable[..., Any], names: list[str], take: Taker) -> Callable[..., Any]:
    """`original`, consulting the plan first (async if `original` is).

    A fault stalls for its delay, then raises before the work, or with
    `after` once the work is done (a delay-only fault raises nothing)."""
    if inspect.iscoroutinefunction(original):

        async def hooked_async(self: Any, *args: Any, **kwargs: Any) -> Any:
            fault = take(self, names)
            if fault is None:
                return await original(self, *args, **kwargs)
            phase, armed = fault
            if armed.delay:
                await asyncio.sleep(armed.delay)  # the injected slowness
            if not armed.after:
                armed.raise_error(phase)
            result = await original(self, *args, **kwargs)
            armed.raise_error(phase)
            return result

        return _named_like(hooked_async, original)

    def hooked(self: Any, *args: Any, **kwargs: Any) -> Any:
        fault = take(self, names)
        if fault is None:
            return original(self, *args, **kwargs)
        phase, armed = fault
        if armed.delay:
            time.sleep(armed.delay)  # the injected slowness, on the hook's own thread
        if not armed.after:
            armed.raise_error(phase)
        result = original(self, *args, **kwargs)
        armed.raise_error(phase)
        return result

    return _named_like(hooked, original)


def hooked_receive(
    original: Callable[..., Any], on_message: list[tuple[str, type]], take: Taker
) -> Callable[..., Any]:
    """`receive`, consulting the plan for the message phases first (as `hooked`)."""

    async def receive(self: Any, message: Any) -> Any:
        names = [phase for phase, kind in on_message if isinstance(message, kind)]
        fault = take(self, names) if names else None
        if fault is not None:
            if fault[1].delay:
                await asyncio.sleep(fault[1].delay)  # the injected slowness
            if not fault[1].after:
                fault[1].raise_error(fault[0])
        result = original(self, message)
        if inspect.isawaitable(result):
            result = await result
        if fault is not None:
            fault[1].raise_error(fault[0])
        return result

    return _named_like(receive, original)


def _named_like(hook: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    hook.__name__ = hook.__qualname__ = original.__name__
    hook.__doc__ = original.__doc__
    return hook
