"""Learning-rate schedules against torch.optim.lr_scheduler's own recurrences.

torch is not installed here, so each reference below re-implements, in
float64, the *recursive* (chainable) `get_lr` that torch applies when a
scheduler is stepped once per epoch, as published in torch's source; atomr
uses the closed forms. They must agree step for step.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pytest

from atomr.train import OptimizerKind
from atomr.train.core.schedule import (
    ChainedScheduler,
    CosineAnnealingLR,
    LinearLR,
    LrSchedule,
    MultiStepLR,
    SequentialLR,
    StepLR,
    register_schedule,
    schedule_from_config,
)

EPOCHS = 60


def torch_step_lr(base: float, step_size: int, gamma: float) -> list[float]:
    lrs, lr = [], base
    for epoch in range(EPOCHS):
        if epoch != 0 and epoch % step_size == 0:
            lr *= gamma
        lrs.append(lr)
    return lrs


def torch_multistep_lr(base: float, milestones: list[int], gamma: float) -> list[float]:
    lrs, lr = [], base
    for epoch in range(EPOCHS):
        if epoch in milestones:
            lr *= gamma ** milestones.count(epoch)
        lrs.append(lr)
    return lrs


def torch_cosine_lr(base: float, t_max: int, eta_min: float) -> list[float]:
    lrs, lr = [], base
    for epoch in range(EPOCHS):
        if epoch == 0:
            lr = base
        elif (epoch - 1 - t_max) % (2 * t_max) == 0:
            lr = lr + (base - eta_min) * (1 - math.cos(math.pi / t_max)) / 2
        else:
            lr = (1 + math.cos(math.pi * epoch / t_max)) / (
                1 + math.cos(math.pi * (epoch - 1) / t_max)
            ) * (lr - eta_min) + eta_min
        lrs.append(lr)
    return lrs


def torch_linear_lr(base: float, start: float, end: float, total: int) -> list[float]:
    lrs, lr = [], base
    for epoch in range(EPOCHS):
        if epoch == 0:
            lr = base * start
        elif epoch <= total:
            lr = lr * (1.0 + (end - start) / (total * start + (epoch - 1) * (end - start)))
        lrs.append(lr)
    return lrs


def atomr_lrs(schedule: object, base: float) -> list[float]:
    kind = OptimizerKind.sgd(base).with_schedule(schedule)  # type: ignore[arg-type]
    return [kind.lr_at(epoch) for epoch in range(EPOCHS)]


@pytest.mark.parametrize(
    "schedule, reference",
    [
        (StepLR(7, 0.5), torch_step_lr(0.1, 7, 0.5)),
        (MultiStepLR((5, 12, 30), 0.3), torch_multistep_lr(0.1, [5, 12, 30], 0.3)),
        (CosineAnnealingLR(17, 0.001), torch_cosine_lr(0.1, 17, 0.001)),
        (CosineAnnealingLR(10), torch_cosine_lr(0.1, 10, 0.0)),
        (LinearLR(0.25, 1.0, 8), torch_linear_lr(0.1, 0.25, 1.0, 8)),
        (LinearLR(1.0, 0.1, 20), torch_linear_lr(0.1, 1.0, 0.1, 20)),
    ],
    ids=["step", "multistep", "cosine", "cosine-to-zero", "linear-warmup", "linear-decay"],
)
def test_each_schedule_equals_torchs_recurrence(schedule: object, reference: list[float]) -> None:
    np.testing.assert_allclose(atomr_lrs(schedule, 0.1), reference, rtol=1e-9, atol=1e-15)


def test_chained_warm_up_and_step_decay_multiply() -> None:
    # torch's ChainedScheduler steps both on one optimizer: the recurrences multiply
    warm = torch_linear_lr(1.0, 0.1, 1.0, 5)
    decay = torch_step_lr(1.0, 10, 0.5)
    reference = [0.2 * w * d for w, d in zip(warm, decay, strict=True)]
    chained = ChainedScheduler((LinearLR(0.1, 1.0, 5), StepLR(10, 0.5)))
    np.testing.assert_allclose(atomr_lrs(chained, 0.2), reference, rtol=1e-9)


def test_sequential_warm_up_then_cosine() -> None:
    # torch's SequentialLR: the second schedule restarts its epochs at the milestone
    warm = torch_linear_lr(0.1, 0.01, 1.0, 5)[:5]
    cosine = torch_cosine_lr(0.1, 40, 0.0)[: EPOCHS - 5]
    schedule = SequentialLR((LinearLR(0.01, 1.0, 5), CosineAnnealingLR(40)), (5,))
    np.testing.assert_allclose(atomr_lrs(schedule, 0.1), warm + cosine, rtol=1e-9, atol=1e-15)


def test_the_optimizer_uses_the_scheduled_rate_update_by_update() -> None:
    # SGD without momentum: after t updates, p = p0 - sum(lr_e for e < t) * g
    schedule = SequentialLR((LinearLR(0.2, 1.0, 3), StepLR(4, 0.5)), (3,))
    kind = OptimizerKind.sgd(0.5).with_schedule(schedule)
    opt = kind.create(4)
    params = np.ones(4, dtype=np.float32)
    grads = np.full(4, 0.25, dtype=np.float32)
    expected = np.ones(4)
    for epoch in range(12):
        opt.step(params, grads)
        expected -= kind.lr_at(epoch) * 0.25
        np.testing.assert_allclose(params, expected, rtol=1e-5, atol=1e-6)  # float32 sums
    assert opt.step_count == 12


def test_schedules_round_trip_through_their_config_and_the_optimizers() -> None:
    schedule = SequentialLR(
        (ChainedScheduler((LinearLR(0.5, 1.0, 2), MultiStepLR((3, 6)))), CosineAnnealingLR(9)),
        (4,),
    )
    assert schedule_from_config(schedule.to_config()) == schedule
    kind = OptimizerKind.adamw(1e-3).with_schedule(schedule)
    assert OptimizerKind.from_config(kind.to_config()) == kind
    assert "schedule" not in OptimizerKind.adamw(1e-3).to_config()  # the old format


@pytest.mark.parametrize(
    "make",
    [
        lambda: StepLR(np.int64(3), np.float32(0.5)),
        lambda: MultiStepLR([np.int32(2), np.int64(5)], np.float64(0.1)),
        lambda: CosineAnnealingLR(np.int64(9), np.float32(0.25)),
        lambda: LinearLR(np.float32(0.5), np.float16(1.0), np.uint8(4)),
    ],
    ids=["step", "multistep", "cosine", "linear"],
)
def test_numpy_scalars_are_taken_as_plain_numbers_and_the_config_is_json(make: Any) -> None:
    """An `np.int64` step size was kept as it came, and the checkpoint's
    JSON header could not hold the config (the save failed after the
    training); an `np.float32` gamma was refused as 'not a number'."""
    schedule = make()
    config = schedule.to_config()
    assert all(type(v) in (str, int, float, list) for v in config.values())
    assert schedule_from_config(json.loads(json.dumps(config))) == schedule


@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda: StepLR(0), ValueError, "step_size"),
        (lambda: StepLR(2.5), TypeError, "step_size must be an int, got 2.5"),
        (lambda: StepLR(True), TypeError, "step_size must be an int, got True"),
        (lambda: MultiStepLR((2, 4.0)), TypeError, "a milestone must be an int"),
        (lambda: CosineAnnealingLR("9"), TypeError, "t_max must be an int"),
        (lambda: LinearLR(0.5, 1.0, 3.0), TypeError, "total_iters must be an int"),
        (lambda: SequentialLR((StepLR(2), StepLR(3)), (True,)), TypeError, "a milestone"),
        (lambda: StepLR(3, float("nan")), ValueError, "gamma"),
        (lambda: StepLR(3, "0.1"), TypeError, "gamma"),
        (lambda: MultiStepLR((5, 3)), ValueError, "increasing"),
        (lambda: MultiStepLR(()), ValueError, "non-empty"),
        (lambda: MultiStepLR(5), TypeError, "milestones must be a sequence, got 5"),
        (lambda: MultiStepLR("35"), TypeError, "milestones must be a sequence, got '35'"),
        (lambda: SequentialLR(StepLR(2), (3,)), TypeError, "schedules must be a sequence"),
        (lambda: CosineAnnealingLR(0), ValueError, "t_max"),
        (lambda: LinearLR(0.0), ValueError, "start_factor"),
        (lambda: LinearLR(0.5, 2.0), ValueError, "<= 1"),
        (lambda: SequentialLR((StepLR(2), StepLR(3)), (0,)), ValueError, "milestone"),
        (lambda: SequentialLR((StepLR(2),), (3,)), ValueError, "0 increasing milestones"),
        (lambda: ChainedScheduler((CosineAnnealingLR(5),)), ValueError, "SequentialLR"),
        (lambda: ChainedScheduler(()), TypeError, "non-empty"),
        (lambda: OptimizerKind.sgd(0.1).with_schedule("cosine"), TypeError, "LrSchedule"),
    ],
)
def test_bad_schedules_are_refused(make: object, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        make()  # type: ignore[operator]


@pytest.mark.parametrize(
    "config, match",
    [
        ({"kind": "exponential", "gamma": 0.9}, "unknown schedule"),
        ({"kind": "step", "step_size": 3, "evil": 1}, "bad fields"),
        ({"kind": "step"}, "bad fields"),
        ({"kind": "sequential", "schedules": "no", "milestones": []}, "must be a list"),
        ([1, 2], "must be a dict"),
    ],
)
def test_hostile_schedule_configs_are_refused(config: object, match: str) -> None:
    with pytest.raises((ValueError, TypeError), match=match):
        schedule_from_config(config)


@pytest.mark.parametrize(
    ("config", "error", "match"),
    [
        ({"kind": "step", "step_size": "3"}, TypeError, "step_size must be an int, got '3'"),
        ({"kind": "multistep", "milestones": [2.5]}, TypeError, "a milestone must be an int"),
        ({"kind": "cosine", "t_max": True}, TypeError, "t_max must be an int, got True"),
        ({"kind": "step", "step_size": 3, "evil": 1}, ValueError, r"unknown \['evil'\]"),
        ({"kind": "step"}, ValueError, r"missing \['step_size'\]"),
    ],
)
def test_a_config_of_the_wrong_type_is_a_type_error_a_wrong_field_a_value_error(
    config: dict[str, Any], error: type, match: str
) -> None:
    """As the docs say: a wrong type is a TypeError (it was a ValueError
    'bad fields ...'), an unknown or missing field a ValueError."""
    with pytest.raises(error, match=match) as caught:
        schedule_from_config(config)
    assert type(caught.value) is error


@pytest.mark.parametrize(
    "config",
    [
        {"kind": "step", "step_size": 3, "gamma": 10**400},
        {"kind": "multistep", "milestones": [2], "gamma": 10**400},
        {"kind": "cosine", "t_max": 5, "eta_min": -(10**400)},
        {"kind": "linear", "start_factor": 10**400, "end_factor": 1.0, "total_iters": 3},
        {"kind": "chained", "schedules": [{"kind": "step", "step_size": 1, "gamma": 10**400}]},
    ],
    ids=["step", "multistep", "cosine", "linear", "nested"],
)
def test_a_number_beyond_floats_range_is_a_value_error(config: dict[str, Any]) -> None:
    """An integer such as 10**400 is valid JSON; it was an OverflowError."""
    with pytest.raises(ValueError, match=r"must be finite .*got -?1000000.*\.\.\."):
        schedule_from_config(config)
    kind = {"name": "sgd", "lr": 0.1, "schedule": config}
    with pytest.raises(ValueError, match="must be finite"):
        OptimizerKind.from_config(kind)
    with pytest.raises(ValueError, match="lr must be finite in float64"):
        OptimizerKind.from_config({**kind, "lr": 10**400, "schedule": None})


def test_nesting_is_bounded() -> None:
    config: dict[str, object] = {"kind": "step", "step_size": 1}
    for _ in range(10):
        config = {"kind": "chained", "schedules": [config]}
    with pytest.raises(ValueError, match="nested deeper"):
        schedule_from_config(config)


def test_a_growing_schedule_that_overflows_float32_fails_the_update_with_nothing_changed() -> None:
    kind = OptimizerKind.sgd(1.0).with_schedule(StepLR(1, 1e30))
    opt = kind.create(2)
    params = np.ones(2, dtype=np.float32)
    grads = np.ones(2, dtype=np.float32)
    opt.step(params, grads)  # lr 1
    opt.step(params, grads)  # lr 1e30: finite in float32
    before = params.copy()
    with pytest.raises(ValueError, match="update 3: scheduled lr must be finite in float32"):
        opt.step(params, grads)  # lr 1e60: infinite in float32
    np.testing.assert_array_equal(params, before)
    assert opt.step_count == 2


def test_a_scheduled_rate_is_checked_in_the_optimizers_own_dtype() -> None:
    """lr 1e60 is finite in float64: a float64 optimizer takes the update a
    float32 one refuses, and asking the same kind in float32 afterwards (the
    rate unchanged) is still refused: the check is per dtype."""
    kind = OptimizerKind.sgd(1.0).with_schedule(StepLR(1, 1e30))
    opt = kind.create(2, dtype=np.float64)
    params, grads = np.ones(2), np.ones(2)
    for _ in range(3):
        opt.step(params, grads)
    assert opt.step_count == 3 and np.isfinite(params).all() and params[0] < -1e59
    assert kind.hyperparameters_at(2, np.dtype(np.float64)).lr == pytest.approx(1e60)
    with pytest.raises(ValueError, match="update 3: scheduled lr must be finite in float32"):
        kind.hyperparameters_at(2, np.dtype(np.float32))


@pytest.mark.parametrize("schedule", [StepLR(1, 10.0), MultiStepLR(list(range(1, 500)), 10.0)])
def test_a_schedule_beyond_floats_range_is_the_same_value_error(schedule: Any) -> None:
    """10 ** 400 overflows Python's float itself (OverflowError), not only float32."""
    kind = OptimizerKind.sgd(1.0).with_schedule(schedule)
    with pytest.raises(ValueError, match="update 401: scheduled"):
        kind.hyperparameters_at(400, np.dtype(np.float64))
    assert kind.lr_at(400) == math.inf  # was the OverflowError itself


@dataclass(frozen=True)
class _Halving(LrSchedule):
    """A schedule of a user's own: halve every `every` epochs."""

    every: int
    kind: ClassVar[str] = "halving-test"

    def lr(self, base: float, epoch: int) -> float:
        return base * 0.5 ** (epoch // self.every)

    def to_config(self) -> dict[str, Any]:
        return {"kind": self.kind, "every": self.every}


def test_a_schedule_of_ones_own_is_refused_until_registered_then_resumes() -> None:
    """An unregistered class was taken: its checkpoint saved, then failed to
    load ('unknown schedule'), hours of training later."""
    with pytest.raises(ValueError, match="_Halving's config does not rebuild it") as info:
        OptimizerKind.sgd(0.1).with_schedule(_Halving(2))
    assert "register_schedule" in str(info.value)
    with pytest.raises(ValueError, match="does not rebuild it"):  # nested too
        OptimizerKind.sgd(0.1).with_schedule(SequentialLR((StepLR(2), _Halving(2)), (3,)))
    register_schedule(_Halving)
    kind = OptimizerKind.sgd(0.1).with_schedule(SequentialLR((StepLR(2), _Halving(2)), (3,)))
    assert OptimizerKind.from_config(json.loads(json.dumps(kind.to_config()))) == kind
    assert register_schedule(_Halving) is _Halving  # again: no change


@pytest.mark.parametrize(
    ("cls", "error", "needle"),
    [
        (StepLR(2), TypeError, "takes an LrSchedule class"),
        (type("Other", (LrSchedule,), {"kind": "step"}), ValueError, "'step' is taken by StepLR"),
        (type("NoKind", (LrSchedule,), {}), ValueError, "needs a str `kind`"),
    ],
)
def test_register_schedule_refuses_what_it_cannot_register(
    cls: Any, error: type, needle: str
) -> None:
    with pytest.raises(error, match=re.escape(needle)):
        register_schedule(cls)


def test_a_cosine_of_a_t_max_beyond_floats_range_holds_the_base_rate() -> None:
    """A t_max of 10**400 (valid JSON, so a checkpoint may hold it) failed
    every update with 'scheduled lr must be finite in float32, got inf':
    `pi * epoch / t_max` overflowed converting t_max to a float."""
    schedule = CosineAnnealingLR(10**400, 0.001)
    assert [schedule.lr(0.1, e) for e in (0, 5, 10**6)] == [0.1, 0.1, 0.1]
    kind = OptimizerKind.sgd(0.1).with_schedule(schedule)
    assert kind.hyperparameters_at(5, np.dtype(np.float32)).lr == 0.1
