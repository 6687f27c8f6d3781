"""`Callbacks`: how `fit` tells its callbacks of an event, and keeps the
failures of those that raise (the rule is `FitCallback`'s docstring)."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from atomr.train.fit_events import FitCallback, FitPosition

__all__ = ["CallbackFailure", "Callbacks", "awaited", "check_callable_hooks"]


async def awaited(hook: str, result: object) -> Any:
    """What `fit`'s hook `hook` (`evaluate`, `agree_to_stop`) returned,
    awaited: a hook is an async function, so its result must be awaitable.

    Raises:
        TypeError: `result` is not awaitable (a plain function was given;
            the message names `hook`).
    """
    if not inspect.isawaitable(result):
        raise TypeError(
            f"{hook} must be an async function (its result awaitable), "
            f"but it returned {type(result).__name__}"
        )
    return await result


def _parameters(hook: str) -> list[str]:
    """The arguments `fit` passes `FitCallback.hook`, by name (its signature's)."""
    return list(inspect.signature(getattr(FitCallback, hook)).parameters)[1:]


HOOKS = {name: _parameters(name) for name in vars(FitCallback) if name.startswith("on_")}
"""Every `FitCallback` hook and the arguments `fit` calls it with."""


def _not_awaited(where: str) -> TypeError:
    """The error of a hook that is an async function: `fit` calls hooks
    without awaiting them, so its body would never run."""
    return TypeError(
        f"callbacks: {where} is an async function, but fit calls its hooks without "
        "awaiting them (its body would never run): make it a plain function"
    )


def check_callable_hooks(callbacks: Sequence[FitCallback]) -> None:
    """Raises TypeError, naming it, for a hook of `callbacks` that cannot
    take the arguments `fit` passes it (an `on_evaluate` written without its
    `position`, say), or that is an async function (`_not_awaited`): checked
    before any step, not when first called, after the first epoch's
    training. A hook whose signature Python cannot read (a builtin) is left
    to its call."""
    for callback in callbacks:
        for hook, names in HOOKS.items():
            method = getattr(callback, hook)
            if inspect.iscoroutinefunction(method) or inspect.isasyncgenfunction(method):
                raise _not_awaited(f"{type(callback).__name__}.{hook}")
            try:
                inspect.signature(method).bind(*names)
            except ValueError:
                continue
            except TypeError as exc:
                raise TypeError(
                    f"callbacks: {type(callback).__name__}.{hook} cannot take the "
                    f"{len(names)} arguments fit passes it ({', '.join(names)}): {exc}"
                ) from None


@dataclass(frozen=True)
class CallbackFailure:
    """A callback raised `error` in `hook` ("Class.hook") after step `step`."""

    error: Exception
    hook: str
    step: int


class Callbacks:
    """A `fit` call's callbacks, in order. Every callback hears every event,
    whatever the others do, until it raises: from then on it hears nothing
    more of the run (a log on a full disk would fail again, hiding its first
    error). The failures are kept, in order, for `fit` to stop the run at
    the next point the position resumes from and raise the first one."""

    def __init__(self, callbacks: Sequence[FitCallback]) -> None:
        self._callbacks = list(callbacks)
        self._failed: list[FitCallback] = []  # by identity: a callback need not be hashable
        self.failures: list[CallbackFailure] = []
        self._noted = 0  # failures named in a note already (`note_others`)

    def tell(self, hook: str, step: int, *args: Any) -> None:
        """Call `hook(*args)` of every callback that has not raised yet, in
        order; one that raises, or returns an awaitable (an async hook
        `check_callable_hooks` could not tell: closed unrun, a TypeError), is
        kept in `failures` (at `step`), and the others are still called.
        Each callback gets a copy of its own of a `FitPosition` among `args`
        (the run's moves on with every step: a callback may keep its copy,
        or change it, and nothing else moves)."""
        for callback in self._callbacks:
            if any(callback is failed for failed in self._failed):
                continue
            own = [replace(a) if isinstance(a, FitPosition) else a for a in args]
            try:
                result = getattr(callback, hook)(*own)
                if inspect.isawaitable(result):
                    getattr(result, "close", lambda: None)()  # no "never awaited" warning
                    raise _not_awaited(f"{type(callback).__name__}.{hook}")
            except Exception as exc:
                self._failed.append(callback)
                self.failures.append(
                    CallbackFailure(exc, f"{type(callback).__name__}.{hook}", step)
                )

    @property
    def first(self) -> CallbackFailure | None:
        """The first failure, or None while no callback has raised."""
        return self.failures[0] if self.failures else None

    def raise_first(self) -> None:
        """Raise the first callback's error, if one raised.

        Raises:
            Exception: that error.
        """
        if self.failures:
            raise self.failures[0].error

    def note_others(self, error: BaseException) -> None:
        """Name on `error` every failure not named yet, but `error`'s own."""
        for failure in self.failures[self._noted :]:
            if failure.error is not error:
                error.add_note(
                    f"the callback {failure.hook} raised too, after step {failure.step}: "
                    f"{failure.error!r}"
                )
        self._noted = len(self.failures)
