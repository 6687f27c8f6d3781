"""Pipeline schedules as plain data: which stage runs the forward (F) or the
backward (B) of which micro-batch, in which order.

A *plan* holds one tuple of `Op`s per stage. A stage runs its ops strictly in
that order; an op starts once its input has arrived (F of stage `s > 0`
needs the activations of F on stage `s - 1`; B of stage `s < p - 1` needs the
gradient of B on stage `s + 1`; B on the last stage needs its own F).

GPipe (all forwards, then all backwards), p = 3 stages, m = 4 micro-batches::

    stage 0  F0 F1 F2 F3 .. .. .. .. B0 B1 B2 B3
    stage 1  .. F0 F1 F2 F3 .. .. B0 B1 B2 B3
    stage 2  .. .. F0 F1 F2 F3 B0 B1 B2 B3

1F1B (PipeDream-flush): stage `s` warms up with `min(p - s - 1, m)`
forwards, then alternates one forward and one backward, then cools down with
the remaining backwards, so it never holds more than `p - s` micro-batches'
activations (GPipe holds all `m`)::

    stage 0  F0 F1 F2 .. .. B0 F3 B1 .. B2 .. B3
    stage 1  .. F0 F1 .. B0 F2 B1 F3 B2 .. B3 ..
    stage 2  .. .. F0 B0 F1 B1 F2 B2 F3 B3 .. ..

With equal op times both take `(m + p - 1)` forward+backward slots, and the
idle share of every stage (the bubble) is `(p - 1) / (m + p - 1)`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from atomr._arguments import int_at_least
from atomr._repr import bounded_repr

__all__ = [
    "Op",
    "OpKind",
    "Schedule",
    "ScheduledOp",
    "ideal_bubble_fraction",
    "ideal_step_time",
    "peak_in_flight",
    "simulate",
    "split_micro_batches",
]


class OpKind(StrEnum):
    """What an op does: the forward or the backward of one micro-batch."""

    FORWARD = "F"
    BACKWARD = "B"


@dataclass(frozen=True, slots=True)
class Op:
    """One unit of pipeline work on one stage.

    Attributes:
        kind: `OpKind.FORWARD` or `OpKind.BACKWARD`.
        micro: index of the micro-batch, `0 <= micro < m`.
    """

    kind: OpKind
    micro: int

    def __str__(self) -> str:
        return f"{self.kind.value}{self.micro}"


def _check_counts(n_stages: int, n_micro: int) -> None:
    """Raises: TypeError: a count that is no int (NumPy's are ints, a bool is
    not: `int_at_least`). ValueError: a count below 1."""
    int_at_least("n_stages", n_stages, 1)
    int_at_least("n_micro", n_micro, 1)


class Schedule(StrEnum):
    """The pipeline schedules: `Schedule.GPIPE` and `Schedule.ONE_F_ONE_B`."""

    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"

    @classmethod
    def parse(cls, value: Schedule | str) -> Schedule:
        """A `Schedule` from itself or its name ("gpipe", "1f1b"; case-insensitive).

        Raises:
            TypeError: neither a `Schedule` nor a str.
            ValueError: unknown name.
        """
        if isinstance(value, Schedule):
            return value
        if not isinstance(value, str):
            raise TypeError(f"a schedule is a Schedule or its name, got {type(value).__name__}")
        key = value.strip().lower().replace("-", "")
        for member in cls:
            if member.value == key:
                return member
        raise ValueError(f"unknown schedule {bounded_repr(value)}; expected 'gpipe' or '1f1b'")

    def stage_ops(self, stage: int, n_stages: int, n_micro: int) -> tuple[Op, ...]:
        """The ordered ops of one stage.

        Args:
            stage: the stage index, `0 <= stage < n_stages`.
            n_stages: p >= 1.
            n_micro: m >= 1.

        Returns:
            `2 m` ops: every micro-batch's F and B, in this schedule's order.

        Raises:
            TypeError: a count or stage index that is no int.
            ValueError: bad counts or stage index.
        """
        _check_counts(n_stages, n_micro)
        if not 0 <= int_at_least("stage", stage, 0) < n_stages:
            raise ValueError(f"stage must be in [0, {n_stages}), got {stage}")
        fwd = [Op(OpKind.FORWARD, k) for k in range(n_micro)]
        bwd = [Op(OpKind.BACKWARD, k) for k in range(n_micro)]
        if self is Schedule.GPIPE:
            return tuple(fwd + bwd)
        warmup = min(n_stages - stage - 1, n_micro)
        ops = fwd[:warmup]
        for k in range(n_micro - warmup):
            ops += [fwd[warmup + k], bwd[k]]
        ops += bwd[n_micro - warmup :]
        return tuple(ops)

    def plan(self, n_stages: int, n_micro: int) -> tuple[tuple[Op, ...], ...]:
        """Every stage's ops (`plan[s]` is `stage_ops(s, ...)`).

        Raises:
            TypeError: a count that is no int.
            ValueError: bad counts.
        """
        _check_counts(n_stages, n_micro)
        return tuple(self.stage_ops(s, n_stages, n_micro) for s in range(n_stages))


def peak_in_flight(ops: Sequence[Op]) -> int:
    """The most micro-batches whose F has run and whose B has not, along `ops`.

    That is the number of micro-batches' activations a stage must hold.
    """
    held = peak = 0
    for op in ops:
        held += 1 if op.kind is OpKind.FORWARD else -1
        peak = max(peak, held)
    return peak


@dataclass(frozen=True, slots=True)
class ScheduledOp:
    """An op placed in time by `simulate`.

    Attributes:
        stage: the stage that runs it.
        op: the op.
        start: when it starts.
        end: when it ends.
    """

    stage: int
    op: Op
    start: float
    end: float


def simulate(
    plan: Sequence[Sequence[Op]], forward_time: float = 1.0, backward_time: float = 1.0
) -> list[ScheduledOp]:
    """Run a plan on an ideal machine: every op takes a fixed time, messages
    take none, each stage runs its ops in order as soon as their inputs exist.

    Args:
        plan: one op sequence per stage (e.g. `Schedule.plan(p, m)`).
        forward_time: duration of every F.
        backward_time: duration of every B.

    Returns:
        Every op with its start and end, in the order they were placed.

    Raises:
        ValueError: the plan deadlocks (some op's input can never be made),
            or an op is missing / repeated.
    """
    p = len(plan)
    done: dict[tuple[int, OpKind, int], float] = {}
    pos = [0] * p
    free = [0.0] * p
    placed: list[ScheduledOp] = []
    total = sum(len(ops) for ops in plan)
    while len(placed) < total:
        progressed = False
        for s in range(p):
            while pos[s] < len(plan[s]):
                op = plan[s][pos[s]]
                if op.kind is OpKind.FORWARD:
                    dep = (s - 1, OpKind.FORWARD, op.micro) if s > 0 else None
                elif s < p - 1:
                    dep = (s + 1, OpKind.BACKWARD, op.micro)
                else:
                    dep = (s, OpKind.FORWARD, op.micro)
                if dep is not None and dep not in done:
                    break
                key = (s, op.kind, op.micro)
                if key in done:
                    raise ValueError(f"stage {s} runs {op} twice")
                start = max(free[s], done[dep] if dep is not None else 0.0)
                end = start + (forward_time if op.kind is OpKind.FORWARD else backward_time)
                done[key] = end
                free[s] = end
                placed.append(ScheduledOp(s, op, start, end))
                pos[s] += 1
                progressed = True
        if not progressed:
            raise ValueError(f"plan deadlocks: stages stuck at positions {pos}")
    return placed


def ideal_step_time(n_stages: int, n_micro: int, stage_time: float) -> float:
    """`(m + p - 1) * stage_time`: a step of GPipe or 1F1B when every stage
    spends `stage_time` (forward + backward) on each micro-batch.

    Raises:
        TypeError, ValueError: as `Schedule.plan`, for the counts."""
    _check_counts(n_stages, n_micro)
    return (n_micro + n_stages - 1) * stage_time


def ideal_bubble_fraction(n_stages: int, n_micro: int) -> float:
    """`(p - 1) / (m + p - 1)`: the idle share of each stage in an ideal step.

    Raises:
        TypeError, ValueError: as `Schedule.plan`, for the counts."""
    _check_counts(n_stages, n_micro)
    return (n_stages - 1) / (n_micro + n_stages - 1)


def split_micro_batches(batch: int, micro_batch_size: int) -> list[int]:
    """Sizes of the micro-batches a batch is cut into, in order.

    Cut by size, not into a number of near-equal parts (`core.partition`):
    the micro-batch size is the pipeline's setting, so every micro-batch but
    the last has exactly that size (`core.partition.bounds` turns the sizes
    into ranges).

    Args:
        batch: number of samples (>= 1).
        micro_batch_size: samples per micro-batch (>= 1); the last one takes
            the remainder.

    Returns:
        `ceil(batch / micro_batch_size)` sizes summing to `batch`.

    Raises:
        ValueError: a count below 1.
    """
    if batch < 1 or micro_batch_size < 1:
        raise ValueError(
            f"need batch >= 1 and micro_batch_size >= 1, got {batch}, {micro_batch_size}"
        )
    full, rest = divmod(batch, micro_batch_size)
    return [micro_batch_size] * full + ([rest] if rest else [])
