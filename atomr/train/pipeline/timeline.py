"""`Timeline`: when each pipeline stage was busy during one step, and the
measured bubble (idle) fraction.

Stages time each op on their device thread (`time.perf_counter`, one clock
for the whole process); the trainer gathers the intervals of a step into a
`Timeline`, available through `GetTimeline()` (`atomr.train.pipeline.messages`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from atomr.train.pipeline.messages import BusyInterval, StageReport
from atomr.train.pipeline.schedule import ideal_bubble_fraction

__all__ = ["BusyInterval", "Timeline"]


@dataclass(frozen=True)
class Timeline:
    """What every stage did during one pipelined step.

    Attributes:
        schedule: the schedule's name ("gpipe" or "1f1b").
        n_stages: p.
        n_micro: m, the number of micro-batches.
        intervals: every op, in start order.
        step_seconds: wall time of the whole step as the trainer saw it
            (fan-out, pipeline, global norm and optimizer apply).
        peak_held: per stage, the most micro-batches whose activations it
            held at once (kept for a backward that had not yet run).
    """

    schedule: str
    n_stages: int
    n_micro: int
    intervals: tuple[BusyInterval, ...]
    step_seconds: float
    peak_held: tuple[int, ...]

    @classmethod
    def from_reports(
        cls,
        schedule: str,
        reports: Sequence[StageReport],
        n_micro: int,
        started: float,
        step_seconds: float,
    ) -> Timeline:
        """The timeline of one step from its stages' reports.

        Args:
            schedule: the schedule's name.
            reports: every stage's `StageReport`, in pipeline order (their
                intervals in absolute `time.perf_counter` seconds).
            n_micro: the step's number of micro-batches.
            started: when the step began (`time.perf_counter` seconds).
            step_seconds: the whole step's wall time.

        Returns:
            The `Timeline`, its intervals relative to `started`, in start order.
        """
        intervals = sorted(
            (
                BusyInterval(s, iv.kind, iv.micro, iv.start - started, iv.end - started)
                for s, report in enumerate(reports)
                for iv in report.intervals
            ),
            key=lambda iv: (iv.start, iv.stage),
        )
        peaks = tuple(report.peak_held for report in reports)
        return cls(schedule, len(reports), n_micro, tuple(intervals), step_seconds, peaks)

    @property
    def span(self) -> float:
        """Seconds from the first op's start to the last op's end."""
        if not self.intervals:
            return 0.0
        return max(i.end for i in self.intervals) - min(i.start for i in self.intervals)

    def busy(self, stage: int) -> float:
        """Total seconds stage `stage` spent running ops."""
        return sum(i.duration for i in self.intervals if i.stage == stage)

    @property
    def bubble_fraction(self) -> float:
        """Measured idle share: `1 - sum(busy) / (p * span)`."""
        span = self.span
        if span <= 0.0:
            return 0.0
        total = sum(i.duration for i in self.intervals)
        return 1.0 - total / (self.n_stages * span)

    @property
    def ideal_bubble_fraction(self) -> float:
        """`(p - 1) / (m + p - 1)`: the bubble with equal op times and free messages."""
        return ideal_bubble_fraction(self.n_stages, self.n_micro)

    def render(self, width: int = 60) -> str:
        """An ASCII chart: one row per stage, `F`/`B` where it was busy, `.` idle.

        Args:
            width: characters for the span (>= 10).

        Returns:
            The chart, one line per stage plus a legend line.
        """
        width = max(10, int(width))
        span = self.span or 1.0
        origin = min((i.start for i in self.intervals), default=0.0)
        rows = [["."] * width for _ in range(self.n_stages)]
        for i in self.intervals:
            lo = int((i.start - origin) / span * width)
            hi = max(lo + 1, int(round((i.end - origin) / span * width)))
            for c in range(lo, min(hi, width)):
                rows[i.stage][c] = i.kind
        lines = [f"stage {s}  {''.join(row)}" for s, row in enumerate(rows)]
        lines.append(
            f"{self.schedule}: p={self.n_stages} m={self.n_micro} span={span * 1e3:.2f} ms "
            f"bubble={self.bubble_fraction:.3f} (ideal {self.ideal_bubble_fraction:.3f})"
        )
        return "\n".join(lines)
