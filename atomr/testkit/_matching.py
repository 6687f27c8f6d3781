"""How ``TestProbe``'s waits match a message: checked before one is taken;
``Unfiltered``, a message ``ignore_msg``'s predicate raised on."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, TypeVar

from atomr.actor.errors import bounded_repr

__all__ = ["Unfiltered", "check_class", "check_predicate", "not_awaitable", "same"]

T = TypeVar("T")


def same(message: Any, expected: Any) -> bool:
    """``message == expected``; NumPy arrays (``==`` element-wise) are the
    same when their shapes and all their elements are (a list is no array).

    Raises:
        TypeError: ``==`` raised or gave no truth value (arrays inside a tuple
            or a dataclass), saying how to compare such a message.
    """
    shapes = [getattr(value, "shape", None) for value in (message, expected)]
    shapes = [shape if isinstance(shape, tuple) else None for shape in shapes]  # arrays'
    try:
        if shapes[0] != shapes[1] and (None not in shapes or any(shapes)):  # () is a scalar
            return False
        equal = message == expected
        return bool(equal.all() if isinstance(getattr(equal, "shape", None), tuple) else equal)
    except Exception as error:
        raise TypeError(
            f"expect_msg cannot compare {bounded_repr(message)} with {bounded_repr(expected)} "
            f"by == ({type(error).__name__}: {error}): take it with expect_msg_type or "
            "fish_for_message and compare its arrays with numpy.testing"
        ) from error


def check_class(cls: type[T]) -> type[T]:
    """``cls``, a class that ``isinstance`` can check.

    Raises:
        TypeError: ``cls`` is no class, or one ``isinstance`` refuses (a
            ``typing.Protocol`` that is not ``runtime_checkable``).
    """
    if not isinstance(cls, type):
        raise TypeError(f"cls must be a class, got {bounded_repr(cls)}")
    try:
        isinstance(None, cls)
    except TypeError as error:
        raise TypeError(f"cls {cls.__name__} cannot be checked by isinstance: {error}") from None
    return cls


def check_predicate(predicate: object, *, or_none: bool = False) -> None:
    """Raises TypeError: ``predicate`` is not callable (nor None, when
    ``or_none``), or an ``async def`` function (its coroutine is always true)."""
    if not callable(predicate) and not (or_none and predicate is None):
        none = " or None" if or_none else ""
        raise TypeError(f"predicate must be a function{none}, got {bounded_repr(predicate)}")
    if inspect.iscoroutinefunction(predicate):
        raise TypeError(
            f"predicate {getattr(predicate, '__name__', '?')} is an async function, whose "
            "coroutine is always true: pass a plain function that returns a bool"
        )


def not_awaitable(value: object, what: str) -> object:
    """``value``, what ``what`` returned, refused if awaitable: a coroutine is
    always true, so an ``async def`` predicate or condition would pass unchecked.

    Raises:
        TypeError: ``value`` is awaitable (a coroutine is closed first, so it
            does not warn that it was never awaited).
    """
    if inspect.isawaitable(value):
        if inspect.iscoroutine(value):
            value.close()
        raise TypeError(
            f"{what} returned an awaitable, which is always true: pass a plain "
            "function that returns a bool (an async one cannot be checked)"
        )
    return value


@dataclass(frozen=True, slots=True)
class Unfiltered:
    """A message ``ignore_msg``'s predicate raised on: kept, and the wait
    that takes it fails saying so (the probe actor and its supervision go on)."""

    message: Any
    error: Exception

    def fail(self) -> None:
        """Raises: AssertionError, from the predicate's error."""
        raise AssertionError(
            f"ignore_msg's predicate raised {type(self.error).__name__}: {self.error} "
            f"on {bounded_repr(self.message)}"
        ) from self.error
