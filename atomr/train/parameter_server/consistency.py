"""`Consistency`: how far parameter-server workers may run apart, and the
one check of a staleness bound (`check_staleness_bound`)."""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral

from atomr._arguments import int_at_least

__all__ = ["Consistency", "check_staleness_bound"]


def check_staleness_bound(value: object, name: str) -> int | None:
    """Check a staleness bound: None (no bound) or a count >= 0, by the one
    rule of counts (`_arguments.int_at_least`: a NumPy integer is taken).

    Args:
        value: the bound.
        name: what it is called in the error message.

    Returns:
        The bound as an int, or None.

    Raises:
        TypeError: not None and not an integer (a bool included).
        ValueError: below 0, or beyond `_arguments.INDEX_MAX` (the message
            names the limit).
    """
    return None if value is None else int_at_least(name, value, 0)


@dataclass(frozen=True, slots=True)
class Consistency:
    """The consistency model of a parameter server; build it with
    `asynchronous()`, `bounded(s)` or `synchronous()`.

    - asynchronous: every push is applied on arrival (pushes staler than
      `max_staleness` are rejected, when a bound is set).
    - bounded(s): stale synchronous parallel; a worker's pull waits while it
      has pushed more than `s` gradients more than the slowest worker.
    - synchronous (s = 0): the server waits for one gradient from every
      worker, averages them weighted by their batches' normalisers and applies
      once: the same step as data parallel on the concatenated batch.

    Attributes:
        bound: None (asynchronous), 0 (synchronous) or s >= 1 (bounded).

    Raises:
        TypeError, ValueError: `bound` is not None or a count >= 0
            (`check_staleness_bound`).
    """

    bound: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "bound", check_staleness_bound(self.bound, "the staleness bound"))

    @classmethod
    def asynchronous(cls) -> Consistency:
        """Fully asynchronous: apply every push on arrival."""
        return cls(None)

    @classmethod
    def bounded(cls, s: int) -> Consistency:
        """Stale synchronous parallel with slack `s`.

        Raises:
            TypeError: `s` is not an integer (a bool included; a NumPy
                integer is taken).
            ValueError: `s < 1` (use `synchronous()` for 0), or beyond
                `INDEX_MAX`.
        """
        if isinstance(s, Integral) and not isinstance(s, bool) and s < 1:
            raise ValueError(f"bounded staleness needs s >= 1 (s = 0 is synchronous()), got {s!r}")
        return cls(int_at_least("s", s))  # the type and the limit

    @classmethod
    def synchronous(cls) -> Consistency:
        """Synchronous: one averaged step per round of all workers' gradients."""
        return cls(0)

    @property
    def is_synchronous(self) -> bool:
        """True for s = 0."""
        return self.bound == 0

    @property
    def is_bounded(self) -> bool:
        """True for stale synchronous parallel (s >= 1)."""
        return self.bound is not None and self.bound > 0

    @property
    def name(self) -> str:
        """ "async", "bounded(s)" or "sync"."""
        if self.bound is None:
            return "async"
        return "sync" if self.bound == 0 else f"bounded({self.bound})"
