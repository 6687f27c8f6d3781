"""`Consistency`: how far parameter-server workers may run apart, and the
one check of a staleness bound (`check_staleness_bound`)."""

from __future__ import annotations

from dataclasses import dataclass

from atomr._arguments import int_at_least
from atomr._repr import bounded_repr

__all__ = ["Consistency", "check_staleness_bound"]


def check_staleness_bound(value: object, name: str) -> None:
    """Check a staleness bound: None (no bound) or an int >= 0.

    Args:
        value: the bound.
        name: what it is called in the error message.

    Raises:
        ValueError: anything else (a bool included), or one beyond
            `_arguments.INDEX_MAX` (the message names the limit).
    """
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError(f"{name} must be None or an int >= 0, got {bounded_repr(value)}")
    if value is not None:
        int_at_least(name, value, 0)  # the limit of every count


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
        ValueError: `bound` is not None or an int >= 0.
    """

    bound: int | None = None

    def __post_init__(self) -> None:
        check_staleness_bound(self.bound, "the staleness bound")

    @classmethod
    def asynchronous(cls) -> Consistency:
        """Fully asynchronous: apply every push on arrival."""
        return cls(None)

    @classmethod
    def bounded(cls, s: int) -> Consistency:
        """Stale synchronous parallel with slack `s`.

        Raises:
            ValueError: `s` is not an int >= 1 (use `synchronous()` for 0),
                or one beyond `INDEX_MAX`.
        """
        if isinstance(s, bool) or not isinstance(s, int) or s < 1:
            raise ValueError(f"bounded staleness needs s >= 1 (s = 0 is synchronous()), got {s!r}")
        return cls(int_at_least("s", s))  # and at most INDEX_MAX

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
