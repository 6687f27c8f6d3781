"""`JobTiming`: which jobs of a CPU device actor are short enough to run inline.

Handing a job to the device's worker thread and its result back costs two
thread wake-ups: about 140 us on this 2-core VM under a training step's
load, more than the whole step of a small model (a 64-128-10 MLP at batch 32
takes 50 us). With `DeviceActor.inline_below_s` set (opt-in), a job known to be short (its
last runs averaged less than that) runs on the event loop's thread when the
worker is idle. Every job's time is tracked by the code it runs (an
exponential average), so a checkpoint save or a big step keeps going to the
worker thread; but a usually-short job that turns slow blocks the loop while
it runs, which is why this is off by default.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["INLINE_BELOW_S", "JobTiming"]

T = TypeVar("T")

INLINE_BELOW_S = 200e-6
"""A threshold that suits small models here (the measurement in docs/benchmarks.md)."""

_WEIGHT = 0.2  # of the newest run in the average
_RUNS_BEFORE_INLINE = 3  # timed on the worker first


def _code(fn: Any) -> Any:
    """What identifies the function ``fn`` runs: its code object (a bound
    method's function's), else ``fn`` itself (a builtin). A lambda or closure
    made afresh for each job is one key per place in the source, and the key
    holds none of the values it captured."""
    fn = getattr(fn, "__func__", fn)
    return getattr(fn, "__code__", fn)


def _key(job: Callable[..., Any]) -> Any:
    """Jobs are told apart by the code they run and, for a wrapper given the
    work as its first argument (`guarded(work, ...)`), by that work too: a
    checkpoint save and a step through the same wrapper are different jobs."""
    inner = getattr(job, "func", job)  # functools.partial
    args = getattr(job, "args", ())
    if args and callable(args[0]):
        return _code(inner), _code(args[0])
    return _code(inner)


class JobTiming:
    """Average run time by job function, and whether a job may run inline.

    Args:
        threshold: `INLINE_BELOW_S` by default; 0 disables inline runs.
    """

    def __init__(self, threshold: float = INLINE_BELOW_S) -> None:
        self.threshold = threshold
        self._average: dict[Any, tuple[float, int]] = {}
        self.in_flight = 0  # jobs handed to the worker and not finished

    key = staticmethod(_key)
    """`key(job)`: what tells `job` apart (see `_key`). Each method below
    takes it as `key`, so that a caller who has it is not made to derive it
    again (None: derived from the job)."""

    def inline(self, job: Callable[[], Any], key: Any = None) -> bool:
        """True when `job` has been short its last runs and the worker is idle."""
        if self.threshold <= 0 or self.in_flight:
            return False
        average, runs = self._average.get(_key(job) if key is None else key, (0.0, 0))
        return runs >= _RUNS_BEFORE_INLINE and average < self.threshold

    def timed(self, job: Callable[[], T], key: Any = None) -> Callable[[], T]:
        """`job`, recording its run time (`run` it later, on any thread)."""
        return functools.partial(self.run, job, key)

    def run(self, job: Callable[[], T], key: Any = None) -> T:
        """Run `job` now, on this thread, recording its run time.

        Returns:
            What `job` returns.

        Raises:
            Exception: whatever `job` raises (its time is recorded all the same).
        """
        started = time.perf_counter()
        try:
            return job()
        finally:
            self.record(job, time.perf_counter() - started, key)

    def record(self, job: Callable[..., Any], seconds: float, key: Any = None) -> None:
        """Fold one run of `job` into its average (from any thread: a dict
        assignment is atomic, and a lost update only delays the decision)."""
        k = _key(job) if key is None else key
        average, runs = self._average.get(k, (seconds, 0))
        self._average[k] = ((1.0 - _WEIGHT) * average + _WEIGHT * seconds, runs + 1)
