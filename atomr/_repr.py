"""``bounded_repr``: the one way error texts and log lines show a user's
object, bounded in length and safe from a hostile ``__repr__``. It depends on
nothing in atomr, so that every layer (the argument checks under the runtime
too) can use it; ``atomr.actor.errors`` re-exports it."""

from __future__ import annotations

import collections
import dataclasses
import reprlib
from typing import Any

__all__ = ["REPR_LIMIT", "bounded_repr"]

REPR_LIMIT = 200
"""Characters ``bounded_repr`` returns at most by default."""


class _BoundedRepr(reprlib.Repr):
    """``reprlib.Repr`` that also bounds arrays and dataclasses (a message such as
    ``Step(features, labels)``) instead of calling their own ``__repr__``."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel = 3
        self.maxstring = 60
        self.maxother = 60
        self.maxlong = 40

    def repr_ndarray(self, x: Any, level: int) -> str:
        return f"array(shape={x.shape}, dtype={x.dtype})"

    def repr_bytes(self, x: Any, level: int) -> str:
        head = bytes(x[: self.maxstring])
        return f"{type(x).__name__}(len={len(x)}, {head!r}{'...' if len(x) > len(head) else ''})"

    repr_bytearray = repr_bytes

    def repr_instance(self, x: Any, level: int) -> str:
        for base, abbreviate in self._builtins():
            if isinstance(x, base):  # a subclass (Counter, OrderedDict, ...): abbreviated too
                return f"{type(x).__name__}({abbreviate(x, level)})"
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            if level <= 0:
                return f"{type(x).__name__}(...)"
            fields = ", ".join(
                f"{f.name}={self.repr1(getattr(x, f.name, None), level - 1)}"
                for f in dataclasses.fields(x)
                if f.repr
            )
            return f"{type(x).__name__}({fields})"
        return super().repr_instance(x, level)

    def _builtins(self) -> tuple[tuple[Any, Any], ...]:
        return (
            (dict, self.repr_dict),
            (list, self.repr_list),
            (tuple, self.repr_tuple),
            (set, self.repr_set),
            (frozenset, self.repr_frozenset),
            (collections.deque, self.repr_deque),
            (str, self.repr_str),
            ((bytes, bytearray), self.repr_bytes),
        )


_REPR = _BoundedRepr()


def bounded_repr(value: Any, limit: int = REPR_LIMIT) -> str:
    """A short ``repr`` of ``value`` for error texts and log lines.

    Containers, strings, arrays and dataclasses are abbreviated without building
    their full ``repr``; any other object's ``repr`` is cut to ``limit``
    characters. A ``__repr__`` that raises gives ``<TypeName (repr raised ...)>``.

    Args:
        value: any object.
        limit: the most characters returned (>= 8).
    Returns:
        At most ``limit`` characters; never raises an ``Exception``.
    """
    try:
        text = _REPR.repr(value)
    except (Exception, SystemExit) as error:  # a hostile __repr__ must not end the caller
        text = f"<{type(value).__name__} (repr raised {type(error).__name__})>"
    if len(text) > limit:
        text = text[: max(limit, 8) - 3] + "..."
    return text
