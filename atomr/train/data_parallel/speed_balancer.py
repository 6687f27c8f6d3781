"""`SpeedBalancer`: how a data-parallel step splits its batch among replicas;
`ReplicaSpeeds`: the replicas' speeds as CADENCE and ASYNC measure them,
and `round_quotas`, what CADENCE makes of them.

Off (the default), the batch is split as evenly as possible. On, the split
follows each replica's measured throughput (samples per second of its
forward + backward), smoothed by an exponential moving average and
recalibrated every `recalibrate_every` steps, with a minimum share per
replica so that a slow replica keeps being measured (the approach of flodl's
ElChe). The split only decides *who computes which rows*: the trainer's
weighted all-reduce keeps the result equal to the full-batch gradient for any
split.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from numbers import Real

import numpy as np

from atomr._arguments import array_bytes, bool_flag, building, int_at_least, sequence_entries
from atomr.train.core.partition import split_sizes

__all__ = [
    "WALL_SMOOTHING",
    "ReplicaSpeeds",
    "SpeedBalancer",
    "check_balance_settings",
    "initial_seconds_per_sample",
    "in_seconds",
    "round_quotas",
    "smoothed",
]

WALL_SMOOTHING = 0.5
"""Weight of the newest wall-time measurement of a replica's speed (CADENCE, ASYNC)."""


def initial_seconds_per_sample(hint: tuple[float, ...] | None, replicas: int) -> list[float]:
    """Each replica's seconds per sample before any is measured: from the
    relative speeds in `hint` when it has one per replica, else equal."""
    speeds = hint if hint is not None and len(hint) == replicas else (1.0,) * replicas
    return [1.0 / s for s in speeds]


def round_quotas(anchor: float, seconds_per_sample: Sequence[float]) -> list[float]:
    """Each replica's batches in one El Che round, before rounding
    (`_cadence`): `anchor` for the slowest, and more for a faster one in
    proportion to its speed; `inf` or NaN where that is no float."""
    slowest = max(seconds_per_sample)
    return [anchor * slowest / t for t in seconds_per_sample]


def in_seconds(hinted: list[float], measured: dict[int, float]) -> list[float]:
    """`initial_seconds_per_sample`'s values, a ratio in no unit, in seconds:
    scaled so that the replicas in `measured` (index: seconds per sample)
    match their first measurement on average. Every replica is scaled alike,
    so one that was not measured keeps its hinted ratio to the others
    instead of looking slower (or faster) by the gap between the units.

    Raises:
        ZeroDivisionError: `measured` is empty (nothing to scale by).
    """
    scale = sum(seconds / hinted[i] for i, seconds in measured.items()) / len(measured)
    return [s * scale for s in hinted]


def smoothed(old: float, measured: float, weight: float = WALL_SMOOTHING) -> float:
    """The moving average `old` after one more measurement."""
    return (1.0 - weight) * old + weight * measured


class ReplicaSpeeds:
    """Each replica's seconds per sample under CADENCE and ASYNC, measured
    from the trainer's side.

    A batch's time is from the later of its dispatch and the replica's
    previous result to its result (`busy`): the time the replica worked on
    it, not the time it waited for it (a trainer fed slower than its replicas
    compute would otherwise time its feed, and a replica given more batches
    would look faster), nor the time its earlier queued batches took.

    The estimates start as `speed_hint`'s ratio (`initial_seconds_per_sample`,
    in no unit); the first measurement puts them all in seconds
    (`in_seconds`), then each measurement is smoothed in (`smoothed`).

    Args:
        hint: each replica's relative speed (None: equal).
        replicas: how many replicas.
        clock: seconds that never go back (`DataParallelOptions.clock`).

    Attributes:
        seconds_per_sample: the estimates, in replica order.
        clock: as given; a batch's dispatch is read from it.
    """

    def __init__(
        self, hint: tuple[float, ...] | None, replicas: int, clock: Callable[[], float]
    ) -> None:
        self.seconds_per_sample = initial_seconds_per_sample(hint, replicas)
        self.clock = clock
        self._in_seconds = False
        self._last_result = [-math.inf] * replicas

    def busy(self, replica: int, dispatched: float) -> float:
        """The seconds `replica` worked on the batch dispatched at
        `dispatched` (a `clock` reading), now that its result (or failure)
        has come; its results must come in the order of their batches."""
        now = self.clock()
        seconds = now - max(self._last_result[replica], dispatched)
        self._last_result[replica] = now
        return seconds

    def learn(self, measured: Mapping[int, float]) -> None:
        """Smooth in `measured` (replica index: seconds per sample); the first
        measurement scales every estimate into seconds, so a replica not
        measured yet keeps its ratio to the others."""
        if not measured:
            return
        if not self._in_seconds:
            self.seconds_per_sample = in_seconds(self.seconds_per_sample, dict(measured))
            self._in_seconds = True
        for i, seconds in measured.items():
            self.seconds_per_sample[i] = smoothed(self.seconds_per_sample[i], seconds)


def _apportion(batch: int, shares: np.ndarray, minimum: int) -> list[int]:
    """Split `batch` in proportion to `shares`, each size >= `minimum`.

    Replicas whose proportional size falls below `minimum` get exactly
    `minimum`; the rest is shared among the others in proportion, and
    rounded by largest remainder.
    """
    n = len(shares)
    fixed = np.zeros(n, dtype=bool)
    while True:
        free = batch - minimum * int(fixed.sum())
        exact = np.where(fixed, float(minimum), shares / shares[~fixed].sum() * free)
        newly = ~fixed & (exact < minimum)
        if not newly.any():
            break
        fixed |= newly
    sizes = np.floor(exact).astype(np.int64)
    left = batch - int(sizes.sum())
    remainder = np.where(fixed, -1.0, exact - sizes)
    order = np.argsort(-remainder, kind="stable")
    sizes[order[:left]] += 1
    return [int(v) for v in sizes]


def check_balance_settings(
    speed_hint: Sequence[float] | np.ndarray | None, recalibrate_every: int, min_share: float
) -> None:
    """Check the balancing settings that do not depend on the replica count.

    Args:
        speed_hint: None, or positive finite relative speeds (a list, tuple
            or 1-D array of real numbers).
        recalibrate_every: an int >= 1.
        min_share: a fraction in `[0, 1]`.

    Raises:
        TypeError: `recalibrate_every` is not an int, `min_share` not a
            number, or `speed_hint` not a list, tuple or 1-D array of
            real numbers (a bool is none).
        ValueError: a value is out of range.
    """
    if isinstance(recalibrate_every, bool) or not isinstance(recalibrate_every, int):
        raise TypeError(f"recalibrate_every must be an int, got {recalibrate_every!r}")
    if recalibrate_every < 1:
        raise ValueError(f"recalibrate_every must be >= 1, got {recalibrate_every}")
    if isinstance(min_share, bool) or not isinstance(min_share, Real):
        raise TypeError(f"min_share must be a number, got {min_share!r}")
    if not 0.0 <= min_share <= 1.0:
        raise ValueError(f"min_share must be in [0, 1], got {min_share}")
    if speed_hint is None:
        return
    entries = sequence_entries("speed_hint", speed_hint, "numbers, or None")
    if not all(isinstance(s, Real) and not isinstance(s, bool) for s in entries):
        raise TypeError(f"speed_hint must be a sequence of numbers or None, got {speed_hint!r}")
    speeds = np.asarray(entries, dtype=np.float64)
    if not np.all(np.isfinite(speeds)) or not np.all(speeds > 0):
        raise ValueError(f"speed_hint must be positive finite numbers, got {speed_hint!r}")


class SpeedBalancer:
    """Splits batches among replicas, optionally by measured speed.

    Args:
        n: number of replicas (>= 1).
        enabled: follow measured speed (else always `split_sizes`).
        speed_hint: relative speeds to start from (e.g. `[1, 3]`: the second
            replica is 3x faster), one positive number per replica; default
            all equal.
        recalibrate_every: steps between re-computations of the shares (>= 1).
        min_share: the smallest fraction of the batch a replica is given,
            in `[0, 1/n]`; at least one row when the batch has >= n rows.
        smoothing: weight of the newest measurement in the moving average,
            in `(0, 1]`.

    Raises:
        TypeError: a setting has the wrong type (`check_balance_settings`).
        ValueError: any argument out of range (an `n` whose speeds no array
            holds: `array_bytes`), or a hint of the wrong length.
        MemoryError: `n` speeds too many for memory (the message says so).
    """

    def __init__(
        self,
        n: int,
        *,
        enabled: bool = False,
        speed_hint: Sequence[float] | np.ndarray | None = None,
        recalibrate_every: int = 10,
        min_share: float = 0.05,
        smoothing: float = 0.3,
    ) -> None:
        int_at_least("n", n, 1)
        check_balance_settings(speed_hint, recalibrate_every, min_share)
        if min_share > 1.0 / n:
            raise ValueError(f"min_share must be in [0, 1/{n}], got {min_share}")
        if not 0.0 < smoothing <= 1.0:
            raise ValueError(f"smoothing must be in (0, 1], got {smoothing}")
        what = f"the speeds of {n} replicas"
        with building(what, array_bytes(what, n, 8)):  # float64, before any is made
            speeds = np.ones(n) if speed_hint is None else np.asarray(speed_hint, dtype=np.float64)
        if speeds.shape != (n,):
            raise ValueError(f"speed_hint must be {n} positive finite numbers, got {speed_hint!r}")
        self.n = n
        self.enabled = bool_flag("enabled", enabled)
        self.recalibrate_every = recalibrate_every
        self.min_share = float(min_share)
        self.smoothing = float(smoothing)
        self.speeds = speeds.copy()
        self.shares = speeds / speeds.sum()
        self._since = 0
        self._seen = [False] * n

    def split(self, batch: int) -> list[int]:
        """Shard sizes for a batch of `batch` rows.

        Args:
            batch: rows in the step's batch (>= 1).

        Returns:
            `n` sizes summing to `batch`, in replica order. With fewer rows
            than replicas, the first `batch` replicas get one row each and
            the others none.

        Raises:
            ValueError: `batch < 1`.
        """
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        if not self.enabled or batch < self.n:
            return split_sizes(batch, self.n)
        minimum = max(1, math.floor(self.min_share * batch))
        minimum = min(minimum, batch // self.n)
        return _apportion(batch, self.shares, minimum)

    def record(self, samples: Sequence[int], micros: Sequence[int]) -> None:
        """Feed one step's per-replica measurements.

        Args:
            samples: rows each replica computed.
            micros: each replica's compute time in microseconds; replicas
                with no rows or no time are skipped.
        """
        if not self.enabled:
            return
        for i, (s, t) in enumerate(zip(samples, micros, strict=True)):
            if s > 0 and t > 0:
                speed = s / t
                if self._seen[i]:
                    self.speeds[i] += self.smoothing * (speed - self.speeds[i])
                else:  # the first measurement replaces the hint
                    self.speeds[i] = speed
                    self._seen[i] = True
        self._since += 1
        if self._since >= self.recalibrate_every and all(self._seen):
            self.shares = self.speeds / self.speeds.sum()
            self._since = 0
