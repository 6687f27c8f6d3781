"""Pipeline schedules as data: completeness, dependency order (no deadlock),
ideal step time and bubble, activations held per stage, splitting."""

from __future__ import annotations

import numpy as np
import pytest

from atomr.train.pipeline.schedule import (
    Op,
    OpKind,
    Schedule,
    ideal_bubble_fraction,
    ideal_step_time,
    peak_in_flight,
    simulate,
    split_micro_batches,
)
from atomr.train.pipeline.split import balanced_split

SCHEDULES = [Schedule.GPIPE, Schedule.ONE_F_ONE_B]
GRID = [(p, m) for p in range(1, 6) for m in range(1, 10)]


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize(("p", "m"), GRID)
def test_every_stage_runs_each_forward_then_its_backward_once(schedule, p, m) -> None:
    for s, ops in enumerate(schedule.plan(p, m)):
        assert sorted((op.kind.value, op.micro) for op in ops) == sorted(
            [("F", k) for k in range(m)] + [("B", k) for k in range(m)]
        ), f"stage {s}"
        for k in range(m):
            assert ops.index(Op(OpKind.FORWARD, k)) < ops.index(Op(OpKind.BACKWARD, k))


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize(("p", "m"), GRID)
def test_ideal_run_takes_m_plus_p_minus_1_slots(schedule, p, m) -> None:
    placed = simulate(schedule.plan(p, m), forward_time=1.0, backward_time=1.0)
    span = max(x.end for x in placed)
    assert span == pytest.approx(ideal_step_time(p, m, 2.0))
    busy = sum(x.end - x.start for x in placed)
    assert 1 - busy / (p * span) == pytest.approx(ideal_bubble_fraction(p, m))


@pytest.mark.parametrize(("p", "m"), GRID)
def test_activations_held(p, m) -> None:
    for s in range(p):
        assert peak_in_flight(Schedule.GPIPE.stage_ops(s, p, m)) == m
        assert peak_in_flight(Schedule.ONE_F_ONE_B.stage_ops(s, p, m)) == min(p - s, m)


def test_1f1b_order_matches_the_docstring_picture() -> None:
    plan = Schedule.ONE_F_ONE_B.plan(3, 4)
    assert [" ".join(map(str, ops)) for ops in plan] == [
        "F0 F1 F2 B0 F3 B1 B2 B3",
        "F0 F1 B0 F2 B1 F3 B2 B3",
        "F0 B0 F1 B1 F2 B2 F3 B3",
    ]


def test_simulate_detects_a_deadlock() -> None:
    f0, b0 = Op(OpKind.FORWARD, 0), Op(OpKind.BACKWARD, 0)
    # stage 0 waits for B0's gradient before running F0: can never happen
    with pytest.raises(ValueError, match="deadlock"):
        simulate([(b0, f0), (f0, b0)])


def test_parse_and_bad_counts() -> None:
    assert Schedule.parse("GPipe") is Schedule.GPIPE
    assert Schedule.parse("1F1B") is Schedule.ONE_F_ONE_B
    assert Schedule.parse(Schedule.GPIPE) is Schedule.GPIPE
    with pytest.raises(ValueError, match="unknown schedule"):
        Schedule.parse("zigzag")
    with pytest.raises(TypeError, match="a schedule is a Schedule or its name, got int"):
        Schedule.parse(1)  # type: ignore[arg-type]  # a wrong type, not an unknown name
    with pytest.raises(ValueError, match="n_micro"):
        Schedule.GPIPE.plan(2, 0)
    with pytest.raises(ValueError, match="stage"):
        Schedule.GPIPE.stage_ops(2, 2, 1)


def test_counts_are_ints_numpy_ones_too() -> None:
    # the rule of every count argument (`atomr._arguments.int_at_least`)
    p, m = np.int64(3), np.int32(4)
    assert Schedule.ONE_F_ONE_B.plan(p, m) == Schedule.ONE_F_ONE_B.plan(3, 4)  # type: ignore[arg-type]
    assert ideal_bubble_fraction(p, m) == ideal_bubble_fraction(3, 4)  # type: ignore[arg-type]
    assert balanced_split([5, 5, 5], np.int64(3)) == [1, 1, 1]  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="n_micro must be an int"):
        Schedule.GPIPE.plan(2, 2.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="stage must be an int"):
        Schedule.ONE_F_ONE_B.stage_ops(0.5, 2, 2)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="number of stages must be an int"):
        balanced_split([5, 5, 5], True)  # type: ignore[arg-type]


def test_split_micro_batches() -> None:
    assert split_micro_batches(15, 4) == [4, 4, 4, 3]
    assert split_micro_batches(8, 8) == [8]
    assert split_micro_batches(3, 8) == [3]
    with pytest.raises(ValueError):
        split_micro_batches(0, 2)


def test_balanced_split() -> None:
    assert balanced_split([10, 10, 10, 10], 2) == [2, 2]
    assert balanced_split([100, 1, 1, 1], 2) == [1, 3]
    assert balanced_split([1, 1, 1, 100], 2) == [3, 1]
    assert balanced_split([5, 5, 5], 3) == [1, 1, 1]
    assert balanced_split([5, 5, 5], 1) == [3]
    with pytest.raises(ValueError, match="3 layers"):
        balanced_split([5, 5, 5], 4)
    with pytest.raises(ValueError):
        balanced_split([5, 5, 5], 0)


def test_a_balanced_split_gives_every_stage_a_layer_with_parameters() -> None:
    # layers 1 and 2 (activations) cost something but hold nothing
    holds = [True, False, False, True]
    assert balanced_split([10, 4, 4, 10], 2, holds) == [2, 2]
    assert balanced_split([10, 1, 1, 30], 2, holds) == [3, 1]
    assert balanced_split([1, 40, 40, 1], 2, holds) == [2, 2]  # not [1, 3]: cost alone would
    with pytest.raises(ValueError, match="parameters in 2 of its 4 layers"):
        balanced_split([10, 4, 4, 10], 3, holds)
