"""DataParallelOptions: every setting is checked once, when the options are
built (a wrong type is a TypeError, a value out of range a ValueError, the
message names the setting), and `for_job` places a process in its job."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atomr.train import (
    DataParallelOptions,
    DataParallelTrainer,
    LossKind,
    OptimizerKind,
    Trainer,
    TrainerConfig,
)
from atomr.train.comm import HostCollective, RingCollective
from atomr.train.comm.mpi import DistributedTrainConfig
from atomr.train.data_parallel import ApplyPolicy, ReplicaActor

MISTAKES: dict[str, tuple[dict[str, Any], type[Exception], str]] = {
    "collective name": ({"collective": "nccl"}, ValueError, "collective"),
    "collective type": ({"collective": 3}, TypeError, "collective"),
    "balance": ({"balance": "yes"}, TypeError, "balance"),
    "speed_hint value": ({"speed_hint": (1.0, -1.0)}, ValueError, "speed_hint"),
    "speed_hint type": ({"speed_hint": "fast"}, TypeError, "speed_hint"),
    "speed_hint 2-D": ({"speed_hint": np.ones((2, 2))}, TypeError, "speed_hint"),
    "speed_hint bools": ({"speed_hint": np.array([True, True])}, TypeError, "speed_hint"),
    "speed_hint array value": ({"speed_hint": np.array([1.0, -1.0])}, ValueError, "speed_hint"),
    "recalibrate_every value": ({"recalibrate_every": 0}, ValueError, "recalibrate_every"),
    "recalibrate_every type": ({"recalibrate_every": 1.5}, TypeError, "recalibrate_every"),
    "min_share value": ({"min_share": 2.0}, ValueError, "min_share"),
    "min_share type": ({"min_share": "x"}, TypeError, "min_share"),
    "check_every value": ({"check_every": 0}, ValueError, "check_every"),
    "check_every type": ({"check_every": "2"}, TypeError, "check_every"),
    "process_collective type": ({"process_collective": "mpi"}, TypeError, "process_collective"),
    "process_collective on members": (
        {"process_collective": RingCollective()},
        ValueError,
        "process_collective",
    ),
    "process_count type": ({"process_count": 2.0}, TypeError, "process_count"),
    "process_count without collective": ({"process_count": 2}, ValueError, "process_collective"),
    "process_rank": (
        {"process_collective": HostCollective(), "process_rank": 2, "process_count": 2},
        ValueError,
        "process_rank",
    ),
    "replica_class not a replica": ({"replica_class": Trainer}, TypeError, "replica_class"),
    "replica_class not a class": ({"replica_class": "ReplicaActor"}, TypeError, "replica_class"),
    "clock not a function": ({"clock": 0.0}, TypeError, "clock"),
    # a policy's name is no policy; the message says what to write
    "policy name": ({"policy": "sync"}, TypeError, r"ApplyPolicy.SYNC, .CADENCE or .ASYNC"),
}


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_each_setting_is_checked_when_built(mistake: str) -> None:
    given, error, names = MISTAKES[mistake]
    with pytest.raises(error, match=names):
        DataParallelOptions(**given)


def test_defaults_and_a_collective_instance() -> None:
    assert DataParallelOptions().collective == "host"
    assert DataParallelOptions().replica_class is ReplicaActor
    ring = RingCollective(5.0)
    assert DataParallelOptions(collective=ring).collective is ring
    assert DataParallelOptions(balance=True, speed_hint=[1, 3]).speed_hint == (1.0, 3.0)


def test_for_job_places_the_process() -> None:
    job = DistributedTrainConfig(world_size=3, rank=2, backend="none")
    host = HostCollective()
    options = DataParallelOptions.for_job(job, process_collective=host, check_every=5)
    assert (options.process_rank, options.process_count) == (2, 3)
    assert options.process_collective is host and options.check_every == 5
    # one process, no MPI: no collective needed
    single = DataParallelOptions.for_job(DistributedTrainConfig())
    assert single.process_collective is None and single.process_count == 1
    with pytest.raises(ValueError, match="process_collective"):
        DataParallelOptions.for_job(job)  # 3 processes, no MPI backend, no collective
    with pytest.raises(TypeError, match="job"):
        DataParallelOptions.for_job({"rank": 0})  # type: ignore[arg-type]


def test_props_refuses_a_replica_class_it_would_not_use() -> None:
    class Mine(ReplicaActor):
        pass

    config = TrainerConfig(OptimizerKind.sgd(0.1), LossKind.MSE)
    options = DataParallelOptions(replica_class=Mine)
    assert options.replica_class is Mine
    with pytest.raises(ValueError, match="replica_class is how spawn builds its replicas"):
        DataParallelTrainer.props(config, [], options)


ASYNC_ONLY = {"average_every": 2, "average_seconds": 1.0}
CADENCE_ONLY = {
    "cadence_anchor": 2,
    "cadence_target": 0.2,
    "cadence_auto_tune": False,
    "cadence_measure_speeds": False,
}
ELSEWHERE = [
    (name, value, policy)
    for settings, applies in ((ASYNC_ONLY, ApplyPolicy.ASYNC), (CADENCE_ONLY, ApplyPolicy.CADENCE))
    for name, value in settings.items()
    for policy in ApplyPolicy
    if policy is not applies
]


@pytest.mark.parametrize(("name", "value", "policy"), ELSEWHERE)
def test_a_setting_of_another_policy_is_refused(name: str, value: Any, policy: ApplyPolicy) -> None:
    with pytest.raises(ValueError, match=f"{name} .*does not apply to ApplyPolicy.{policy.name}"):
        DataParallelOptions(policy=policy, **{name: value})


@pytest.mark.parametrize("policy", list(ApplyPolicy))
def test_the_defaults_of_every_policy_are_accepted(policy: ApplyPolicy) -> None:
    assert DataParallelOptions(policy=policy).policy is policy
    settings = {ApplyPolicy.ASYNC: ASYNC_ONLY, ApplyPolicy.CADENCE: CADENCE_ONLY}.get(policy, {})
    DataParallelOptions(policy=policy, **settings)


def _tick() -> float:
    return 0.0


NOT_READ = [
    *((name, value, policy) for name, value in (("balance", True), ("recalibrate_every", 3),
      ("min_share", 0.1)) for policy in (ApplyPolicy.CADENCE, ApplyPolicy.ASYNC)),
    ("clock", _tick, ApplyPolicy.SYNC),
    ("check_every", 2, ApplyPolicy.ASYNC),
]  # fmt: skip
"""A setting under a policy that never reads it (each read elsewhere)."""


@pytest.mark.parametrize(("name", "value", "policy"), NOT_READ)
def test_a_setting_the_policy_does_not_read_is_refused(
    name: str, value: Any, policy: ApplyPolicy
) -> None:
    with pytest.raises(ValueError, match=f"{name} does not apply to ApplyPolicy.{policy.name}"):
        DataParallelOptions(policy=policy, **{name: value})


@pytest.mark.parametrize(
    ("name", "value"), [("speed_hint", (1.0, 2.0)), ("recalibrate_every", 3), ("min_share", 0.1)]
)
def test_a_balancer_setting_without_balance_is_refused(name: str, value: Any) -> None:
    with pytest.raises(
        ValueError, match=f"{name} does not apply to ApplyPolicy.SYNC without balance"
    ):
        DataParallelOptions(**{name: value})
    assert getattr(DataParallelOptions(balance=True, **{name: value}), name) is not None


READ = {
    ApplyPolicy.SYNC: {"balance": True, "speed_hint": (1.0, 2.0), "recalibrate_every": 3,
                       "min_share": 0.1, "check_every": 2},
    ApplyPolicy.CADENCE: {"speed_hint": (1.0, 2.0), "clock": _tick, "check_every": 2},
    ApplyPolicy.ASYNC: {"speed_hint": (1.0, 2.0), "clock": _tick},
}  # fmt: skip
"""The settings each policy reads: never refused there."""


@pytest.mark.parametrize("policy", list(ApplyPolicy))
def test_the_settings_a_policy_reads_are_accepted(policy: ApplyPolicy) -> None:
    options = DataParallelOptions(policy=policy, **READ[policy])
    assert all(getattr(options, name) == value for name, value in READ[policy].items())


def test_the_docs_options_table_lists_every_field() -> None:
    """docs/data_parallel.md's table of `DataParallelOptions` (before, it left
    out `policy`, `average_*`, `cadence_*` and `replica_class`)."""
    page = Path(__file__).resolve().parents[3] / "docs" / "data_parallel.md"
    rows = re.findall(r"^\| (`[^|]*`) \|", page.read_text(encoding="utf-8"), flags=re.M)
    listed = {name for row in rows for name in re.findall(r"`(\w+)`", row)}
    assert [f.name for f in fields(DataParallelOptions) if f.name not in listed] == []


def test_numbers_are_checked_by_the_one_rule_numpy_scalars_included() -> None:
    """`atomr._arguments`: a wrong type is a TypeError, and NumPy's scalars
    are numbers. `max_steps` and `accumulation_steps` answered a wrong type
    with ValueError and refused `np.int64`; `average_seconds`,
    `cadence_target` and `cadence_anchor` refused NumPy's scalars;
    `collective_timeout` took True as 1 s, and "x" failed inside `float()`."""
    sgd, ce = OptimizerKind.sgd(0.1), LossKind.CROSS_ENTROPY
    config = TrainerConfig(sgd, ce, accumulation_steps=np.int64(2), max_steps=np.int64(5))
    assert (config.accumulation_steps, config.max_steps) == (2, 5)
    for field in ("accumulation_steps", "max_steps"):
        for wrong in ("3", 2.0, True):
            with pytest.raises(TypeError, match=field):
                TrainerConfig(sgd, ce, **{field: wrong})
    DataParallelOptions(policy=ApplyPolicy.ASYNC, average_seconds=np.float32(0.5))
    DataParallelOptions(
        policy=ApplyPolicy.CADENCE, cadence_target=np.float32(0.2), cadence_anchor=np.int64(2)
    )
    with pytest.raises(TypeError, match="cadence_target"):
        DataParallelOptions(policy=ApplyPolicy.CADENCE, cadence_target="0.2")
    assert DistributedTrainConfig(collective_timeout=np.float32(2.0)).collective_timeout == 2.0
    for wrong in (True, "x"):
        with pytest.raises(TypeError, match="collective_timeout"):
            DistributedTrainConfig(collective_timeout=wrong)


def test_a_speed_hint_may_be_a_1d_array() -> None:
    """`speed_hint=np.array([1, 3])` was refused (an array is no
    `Sequence`); a 1-D array of real numbers is stored as a tuple of floats,
    as a list is."""
    for hint in (np.array([1, 3]), np.array([1.0, 3.0], dtype=np.float32), [1, 3]):
        options = DataParallelOptions(balance=True, speed_hint=hint)  # type: ignore[arg-type]
        assert options.speed_hint == (1.0, 3.0)
        assert all(type(s) is float for s in options.speed_hint)
