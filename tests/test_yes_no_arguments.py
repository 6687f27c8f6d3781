"""Every yes/no argument is checked by `atomr._arguments.bool_flag`: a
string such as "no", a number or None is refused with an error naming the
argument (it would be taken by its truth, "no" as True), and numpy's bool is
a bool, kept as Python's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import atomr
from atomr.accel import AdamHyperparameters, SgdHyperparameters
from atomr.testkit import Plan
from atomr.train import DataParallelOptions, Mlp, OptimizerKind, ShardedOptions
from atomr.train.data_parallel import ApplyPolicy, SpeedBalancer

# name -> (build with the flag, read the flag back, the error for a non-bool)
FLAGS: dict[str, tuple[Callable[[Any], Any], str, type[Exception]]] = {
    "nesterov": (
        lambda f: SgdHyperparameters(0.1, momentum=0.9, nesterov=f),
        "nesterov",
        TypeError,
    ),
    "decoupled": (lambda f: AdamHyperparameters(0.1, decoupled=f), "decoupled", TypeError),
    "sgd nesterov": (
        lambda f: OptimizerKind.sgd(0.1, momentum=0.9, nesterov=f),
        "nesterov",
        TypeError,
    ),
    "balance": (lambda f: DataParallelOptions(balance=f), "balance", TypeError),
    "cadence_auto_tune": (
        lambda f: DataParallelOptions(policy=ApplyPolicy.CADENCE, cadence_auto_tune=f),
        "cadence_auto_tune",
        TypeError,
    ),
    "cadence_measure_speeds": (
        lambda f: DataParallelOptions(policy=ApplyPolicy.CADENCE, cadence_measure_speeds=f),
        "cadence_measure_speeds",
        TypeError,
    ),
    "shard_checkpoints": (
        lambda f: ShardedOptions(shard_checkpoints=f),
        "shard_checkpoints",
        TypeError,
    ),
    "SpeedBalancer enabled": (lambda f: SpeedBalancer(2, enabled=f), "enabled", TypeError),
    # a model's config that does not build is a ValueError (`Mlp.from_config`)
    "activate_last": (lambda f: Mlp([4, 3], activate_last=f), "activate_last", ValueError),
}


@pytest.mark.parametrize("site", list(FLAGS))
@pytest.mark.parametrize("flag", ["no", 1, None])
def test_a_flag_that_is_not_a_bool_is_refused_naming_it(site: str, flag: object) -> None:
    build, name, error = FLAGS[site]
    with pytest.raises(error, match=f"{name} must be True or False, got {flag!r}"):
        build(flag)


@pytest.mark.parametrize("site", list(FLAGS))
def test_numpys_bool_is_taken_and_kept_as_a_bool(site: str) -> None:
    build, name, _ = FLAGS[site]
    built = build(np.bool_(True))
    assert getattr(built, name) is True


@pytest.mark.parametrize("name", ["use_uvloop", "debug"])
def test_runs_flags_are_none_or_a_bool(name: str) -> None:
    async def main() -> int:
        return 1

    coroutine = main()
    with pytest.raises(TypeError, match=f"{name} must be True or False, got 'no'"):
        atomr.run(coroutine, **{name: "no"})
    assert coroutine.cr_frame is None  # closed: no 'never awaited' warning
    assert atomr.run(main(), **{name: np.bool_(False)}) == 1


def test_a_fault_plans_after_is_a_bool() -> None:
    plan = Plan()
    plan.declare("step")
    with pytest.raises(TypeError, match="after must be True or False, got 'no'"):
        plan.arm("step", after="no")  # type: ignore[arg-type]
    plan.arm("step", after=np.bool_(True))
