"""`atomr.testkit.faults`: a `Plan` fails the armed phase as often as armed,
after the passes it lets through, and `inject_faults` makes only the named
worker fail, at a message or at a public hook, before or after the work, and
refuses private hooks. With `worker=k` through a trainer's options it fails
exactly worker k of the data-parallel trainer (`replica_class`) and of the
parameter server (`worker_class`), and each trainer then recovers or fails
as it documents."""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atomr import Actor, ActorSystem, Props
from atomr.accel import ContextPoisoned, OutOfMemory, cpu_devices
from atomr.testkit import Plan, inject_faults
from atomr.train import LossKind, Mlp, OptimizerKind, Step, TrainerConfig
from atomr.train.core.errors import NonFiniteError
from atomr.train.data_parallel import (
    DataParallelOptions,
    DataParallelTrainer,
    GetReplicaWeights,
    ReplicaActor,
)
from atomr.train.data_parallel.messages import ComputeGradients
from atomr.train.parameter_server import (
    AsyncParameterServer,
    GetServerStats,
    ParameterServerOptions,
    ParameterServerWorker,
    ServerShard,
)
from tests.reliability.faults import (
    CLASSES,
    IN,
    T,
    assert_same_training,
    assert_unchanged,
    batches,
    clean_run,
    faulted_run,
)


class Worker(Actor):
    """Counts what it did; `worker_index` numbers it; `step` is its hook."""

    def __init__(self, index: int, log: list[str]) -> None:
        super().__init__()
        self.index, self.log = index, log

    @property
    def worker_index(self) -> int:
        return self.index

    def step(self, what: str) -> str:
        self.log.append(f"{self.index}:{what}")
        return what

    async def fetch(self, what: str) -> str:
        self.log.append(f"{self.index}:fetch {what}")
        return what

    def receive(self, message: Any) -> Any:
        if isinstance(message, tuple):
            return self.step(message[1])
        self.log.append(f"{self.index}:got {message}")
        return message


def _plan(*phases: str) -> Plan:
    """A plan whose phases `phases` a hand-written hook checks."""
    plan = Plan()
    plan.declare(*phases)
    return plan


def test_a_plan_fails_a_phase_as_often_as_armed() -> None:
    plan = _plan("p", "q")
    plan.fire("p")  # not armed: nothing
    plan.arm("p", KeyError, times=2)
    assert plan.armed("p") == 2 and not plan.due("q")
    with pytest.raises(KeyError, match="injected failure: p"):
        plan.fire("p")
    assert plan.due("p")
    plan.fire("p")  # used up
    assert plan.armed("p") == 0 and plan.fired == ["p", "p"]
    error = OSError("this one")
    plan.arm("p", error)
    with pytest.raises(OSError) as info:
        plan.fire("p")
    assert info.value is error


def test_a_disarmed_phase_fails_no_more() -> None:
    plan = _plan("p")
    assert plan.disarm("p") == 0
    plan.arm("p", KeyError, times=5)
    assert plan.disarm("p") == 5
    plan.fire("p")  # nothing
    assert plan.armed("p") == 0 and plan.fired == []


def test_a_plan_lets_the_skipped_passes_through_first() -> None:
    plan = _plan("p")
    plan.arm("p", KeyError, skip=2)
    plan.fire("p")
    assert not plan.due("p")  # the two passes let through
    assert plan.armed("p") == 1 and plan.fired == []
    with pytest.raises(KeyError):
        plan.fire("p")
    assert plan.armed("p") == 0 and plan.fired == ["p"]


def test_skip_counts_only_the_named_workers_passes() -> None:
    plan, log = Plan(), []
    faulty = inject_faults(Worker, plan, {"step": "step"}, worker=1)
    zero, one = faulty(0, log), faulty(1, log)
    plan.arm("step", ValueError, skip=1)
    zero.step("a")
    one.step("b")  # worker 1's first pass: let through
    zero.step("c")
    with pytest.raises(ValueError):
        one.step("d")  # its second fails
    assert log == ["0:a", "1:b", "0:c"]


@pytest.mark.parametrize(
    ("args", "kwargs", "error"),
    [
        ((1,), {}, TypeError),
        (("p", "boom"), {}, TypeError),
        (("p", int), {}, TypeError),
        (("p",), {"times": 0}, ValueError),
        (("p",), {"times": 1.5}, TypeError),
        (("p",), {"delay": -1.0}, ValueError),
        (("p",), {"delay": float("inf")}, ValueError),
        (("p",), {"delay": float("nan")}, ValueError),
        (("p",), {"delay": True}, TypeError),  # was: a 1 s stall
        (("p",), {"delay": "1"}, TypeError),
        (("p", None), {}, ValueError),
        (("p",), {"skip": -1}, ValueError),
        (("p",), {"skip": True}, TypeError),
    ],
)
def test_arm_refuses_bad_arguments(
    args: tuple[Any, ...], kwargs: dict[str, Any], error: type
) -> None:
    plan = _plan("p")
    with pytest.raises(error):
        plan.arm(*args, **kwargs)
    assert plan.armed("p") == 0  # nothing armed


@pytest.mark.parametrize("use", ["arm", "disarm", "fire", "due", "armed"])
def test_a_phase_no_code_declared_is_refused(use: str) -> None:
    """A plan armed under a misspelt phase ("lss" for "loss") never fired,
    silently: every use of a name that neither `inject_faults` nor
    `declare` gave the plan is a ValueError naming the declared phases, and
    leaves the plan as it was."""
    plan, log = Plan(), []
    faulty = inject_faults(Worker, plan, {"loss": "step", "crash": tuple}, worker=0)
    plan.declare("mid_backward")
    assert plan.phases == ("crash", "loss", "mid_backward")
    plan.arm("loss", KeyError)
    with pytest.raises(ValueError) as info:
        getattr(plan, use)("lss")
    assert str(info.value).startswith(
        "no code checks phase 'lss' of this plan "
        "(the declared phases: 'crash', 'loss', 'mid_backward')"
    )
    with pytest.raises(TypeError, match="phase must be a str, got int"):
        getattr(plan, use)(1)
    assert plan.armed("loss") == 1 and plan.fired == []
    with pytest.raises(KeyError):
        faulty(0, log).step("a")  # the declared phase still fires
    assert plan.fired == ["loss"]


def test_a_fresh_plan_names_no_phases_and_declare_checks_its_names() -> None:
    plan = Plan()
    with pytest.raises(ValueError, match=r"\(the declared phases: none\)"):
        plan.arm("p")
    with pytest.raises(TypeError, match="phase must be a str, got int"):
        plan.declare("p", 3)  # type: ignore[arg-type]
    assert plan.phases == ()  # nothing declared
    for blank in ("", "  "):
        with pytest.raises(ValueError, match=f"phase must be a non-empty name, got {blank!r}"):
            plan.declare("q", blank)
        assert plan.phases == ()  # nothing declared
    plan.declare("p", "p")
    assert plan.phases == ("p",)


def test_a_hook_fails_only_in_the_named_worker_before_or_after_its_work() -> None:
    plan, log = Plan(), []
    faulty = inject_faults(Worker, plan, {"step": "step"}, worker=1)
    assert issubclass(faulty, Worker) and faulty.__name__ == "FaultyWorker"
    zero, one = faulty(0, log), faulty(1, log)
    plan.arm("step", ValueError)
    assert zero.step("a") == "a"  # worker 0 does not use up the arming
    with pytest.raises(ValueError, match="injected failure: step"):
        one.step("b")
    assert log == ["0:a"]  # raised before the work
    plan.arm("step", ValueError, after=True)
    with pytest.raises(ValueError):
        one.step("c")
    assert log == ["0:a", "1:c"]  # the work ran, then it failed
    assert one.step("d") == "d" and plan.fired == ["step", "step"]


async def test_an_async_hook_stalls_and_fails_as_armed() -> None:
    plan, log = Plan(), []
    faulty = inject_faults(Worker, plan, {"slow": "fetch", "bad": "fetch"})
    worker = faulty(0, log)
    plan.arm("slow", None, delay=0.01)  # the injected slowness, then it works
    assert await worker.fetch("x") == "x"
    plan.arm("bad", RuntimeError)
    with pytest.raises(RuntimeError, match="bad"):
        await worker.fetch("y")
    assert log == ["0:fetch x"] and plan.fired == ["slow", "bad"]


async def test_a_message_phase_fails_the_actor_in_receive(actor_system: ActorSystem) -> None:
    plan, log = Plan(), []
    faulty = inject_faults(Worker, plan, {"tuple": tuple, "late": str}, worker=0)
    ref = actor_system.spawn(Props(faulty, 0, log))
    plan.arm("tuple", ConnectionError)
    with pytest.raises(ConnectionError, match="injected failure: tuple"):
        await ref.ask(("step", "a"), timeout=5)
    assert log == []  # failed before handling it
    plan.arm("late", ConnectionError, after=True)
    with pytest.raises(ConnectionError):
        await ref.ask("hello", timeout=5)
    assert log == ["0:got hello"]  # handled, then the actor failed instead of replying
    assert await ref.ask(("step", "b"), timeout=5) == "b"  # restarted, serving
    assert plan.fired == ["tuple", "late"]


def test_a_plan_is_shared_safely_between_threads() -> None:
    plan = _plan("p")
    plan.arm("p", RuntimeError, times=100)
    failures: list[int] = []

    def hammer() -> None:
        for _ in range(50):
            try:
                plan.fire("p")
            except RuntimeError:
                failures.append(1)

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(failures) == 100 and plan.armed("p") == 0


class NoIndex:
    def work(self) -> None:
        """Public work."""

    def _hidden(self) -> None:
        """Private work."""


class SetInInit:
    worker_index = -1  # declared on the class, as the refusal of NoIndex asks

    def __init__(self, index: int) -> None:
        self.worker_index = index

    def work(self) -> int:
        return self.worker_index


def test_a_worker_index_declared_on_the_class_and_set_in_init_picks_the_instance() -> None:
    plan = Plan()
    faulty = inject_faults(SetInInit, plan, {"p": "work"}, worker=1)
    zero, one = faulty(0), faulty(1)  # built first, as a trainer's are
    plan.arm("p", times=2)
    assert zero.work() == 0  # not worker 1: let through, the arming kept
    with pytest.raises(RuntimeError, match="injected failure: p"):
        one.work()
    assert plan.fired == ["p"] and plan.armed("p") == 1


@pytest.mark.parametrize(
    ("cls", "phases", "kwargs", "error", "match"),
    [
        ("not a class", {"p": "work"}, {}, TypeError, "must be a class"),
        (NoIndex, {}, {}, ValueError, "phases is empty"),
        (NoIndex, {"p": "_hidden"}, {}, ValueError, "private"),
        (NoIndex, {"p": "missing"}, {}, ValueError, "no public method"),
        (NoIndex, {"p": 3}, {}, TypeError, "message class or a method name"),
        (NoIndex, {"p": str}, {}, TypeError, "no receive"),
        (NoIndex, {"p": "work"}, {"worker": 1}, TypeError, "no worker_index.*declare it on the"),
        (NoIndex, [("p", "work")], {}, TypeError, "phases must be a mapping"),
        (NoIndex, {1: "work"}, {}, TypeError, "phase must be a str, got int"),  # never armed
        (NoIndex, {"": "work"}, {}, ValueError, "phase must be a non-empty name, got ''"),
        (Worker, {"p": "step"}, {"worker": True}, TypeError, "worker must be an int"),
        (Worker, {"p": "step"}, {"worker": "1"}, TypeError, "worker must be an int"),
        (Worker, {"p": "step"}, {"worker": -1}, ValueError, "worker must be >= 0"),
    ],
)
def test_inject_faults_refuses_what_it_cannot_hook(
    cls: Any, phases: dict[str, Any], kwargs: dict[str, Any], error: type, match: str
) -> None:
    with pytest.raises(error, match=match):
        inject_faults(cls, Plan(), phases, **kwargs)
    with pytest.raises(TypeError, match="plan must be a Plan"):
        inject_faults(NoIndex, object(), {"p": "work"})  # type: ignore[arg-type]


def _documented_hooks() -> list[tuple[str, str]]:
    """`(class name, method)` of every hook docs/reliability.md lists for
    `inject_faults` (`Class.a` / `b` / `c`)."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "reliability.md").read_text()
    section = text[text.index("The hooks are documented") : text.index("Private methods")]
    found = []
    for cls, first, rest in re.findall(r"`([A-Z]\w+)\.(\w+)`((?:\s*/\s*`\w+`)*)", section):
        found += [(cls, name) for name in [first, *re.findall(r"`(\w+)`", rest)]]
    return found


@pytest.mark.parametrize(("cls", "method"), _documented_hooks())
def test_every_hook_the_docs_name_is_one_inject_faults_takes(cls: str, method: str) -> None:
    from atomr.train.pipeline import StageActor
    from atomr.train.tensor_parallel import ShardActor

    classes = {c.__name__: c for c in (ReplicaActor, ShardActor, StageActor)}
    classes |= {c.__name__: c for c in (ParameterServerWorker, ServerShard)}
    inject_faults(classes[cls], Plan(), {"p": method})


# -- the trainers' own workers, worker k faulted through the trainer's options --

CONFIG = TrainerConfig(OptimizerKind.sgd(0.1, momentum=0.9), LossKind.CROSS_ENTROPY)
DP_PHASES: dict[str, str | type] = {"compute": "compute_gradients", "crash": ComputeGradients}


@pytest.mark.parametrize(
    ("worker", "phase", "error"),
    [(1, "compute", ContextPoisoned), (2, "crash", RuntimeError), (0, "compute", OutOfMemory)],
)
async def test_replica_k_fails_and_the_data_parallel_trainer_recovers(
    actor_system: ActorSystem, worker: int, phase: str, error: type[Exception]
) -> None:
    # documented: the step fails with replica k's own error and changes no
    # replica; k is restarted (or resumed) and re-synced; training then ends
    # where a run that skipped the failed batch ends
    plan = Plan()
    faulty = inject_faults(ReplicaActor, plan, DP_PHASES, worker=worker)
    model, devices = Mlp([IN, 8, CLASSES], seed=3), cpu_devices(3)
    dp = await DataParallelTrainer.spawn(
        actor_system, model, devices, CONFIG, DataParallelOptions(replica_class=faulty)
    )
    clean = await DataParallelTrainer.spawn(actor_system, model, devices, CONFIG)

    async def replica_weights() -> list[np.ndarray]:
        return await dp.ask(GetReplicaWeights(), timeout=T)

    data = batches()
    raised, views = await faulted_run(dp, data, plan, phase, replica_weights, error)
    assert isinstance(raised, error) and "injected failure" in str(raised), repr(raised)
    assert getattr(raised, "worker_index", None) == worker and plan.fired == [phase]
    assert_unchanged(views)
    await clean_run(clean, data)
    await assert_same_training(dp, clean)
    np.testing.assert_array_equal(  # bit for bit
        await dp.ask(GetReplicaWeights(), timeout=T),
        await clean.ask(GetReplicaWeights(), timeout=T),
    )


PS_FAULTS: dict[str, tuple[dict[str, Any], type[Exception] | None]] = {
    # fault: (how worker k's gradient phase is armed, what the step raises)
    "crash once": ({"error": ContextPoisoned}, None),  # restarted, its part sent again
    "crash every try": ({"error": ContextPoisoned, "times": 2}, ContextPoisoned),  # 1 retry
    "non-finite": ({"error": NonFiniteError}, NonFiniteError),  # a bad batch: not sent again
}


@pytest.mark.parametrize("worker", [0, 2])
@pytest.mark.parametrize("fault", list(PS_FAULTS))
async def test_worker_k_fails_and_the_parameter_server_retries_or_fails_as_documented(
    actor_system: ActorSystem, worker: int, fault: str
) -> None:
    plan = Plan()
    faulty = inject_faults(
        ParameterServerWorker, plan, {"gradient": "compute_gradients"}, worker=worker
    )
    options = ParameterServerOptions(workers=3, max_retries=1, worker_class=faulty)
    ps = await AsyncParameterServer.spawn(
        actor_system, Mlp([IN, 8, CLASSES], seed=3), cpu_devices(2), CONFIG, options
    )

    async def version() -> int:
        return (await ps.ask(GetServerStats(), timeout=T))[0].version

    (x, y), later = batches(2)
    how, expected = PS_FAULTS[fault]
    plan.arm("gradient", **how)
    if expected is None:  # the part is sent again: every worker's push is applied
        assert (await ps.ask(Step(x, y), timeout=T)).samples == len(y)
        assert await version() == 3
    else:  # only worker k's part is lost: the two others' pushes are applied
        with pytest.raises(expected, match="injected failure") as info:
            await ps.ask(Step(x, y), timeout=T)
        assert getattr(info.value, "worker_index", None) == worker
        assert await version() == 2
    assert plan.fired == ["gradient"] * how.get("times", 1)
    applied = await version()
    assert (await ps.ask(Step(*later), timeout=T)).samples == len(later[1])  # serving
    assert await version() == applied + 3
