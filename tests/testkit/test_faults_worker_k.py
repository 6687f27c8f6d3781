"""`inject_faults(worker=k)` for a trainer with no worker k is an error, not
a fault that silently never fires: `Plan.arm` refuses it once the workers
are built, and a phase armed before fails the first pass of another worker
through it, before that worker's work, changing nothing."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from atomr import ActorSystem
from atomr.accel import cpu_devices
from atomr.testkit import Plan, inject_faults
from atomr.train import Mlp, Step
from atomr.train.data_parallel import (
    DataParallelOptions,
    DataParallelTrainer,
    GetReplicaWeights,
    ReplicaActor,
)
from tests.reliability.faults import CLASSES, IN, T, batches
from tests.testkit.test_faults import CONFIG, Worker

NO_WORKER_2 = r"FaultyWorker was made with worker=2, but its trainer has no worker 2 \(.*: 0, 1\)"


def test_arming_a_worker_that_no_built_worker_is_is_refused() -> None:
    plan, log = Plan(), []
    faulty = inject_faults(Worker, plan, {"step": "step"}, worker=2)
    workers = [faulty(0, log), faulty(1, log)]
    with pytest.raises(ValueError, match=NO_WORKER_2):
        plan.arm("step", KeyError)  # was: armed; no pass ever fired it
    assert plan.armed("step") == 0  # nothing armed
    for worker in workers:
        worker.step("a")
    assert log == ["0:a", "1:a"] and plan.fired == []


def test_a_worker_that_was_built_and_is_gone_is_still_a_worker() -> None:
    plan, log = Plan(), []
    faulty = inject_faults(Worker, plan, {"step": "step"}, worker=1)
    zero, one = faulty(0, log), faulty(1, log)
    del one  # a restarted worker's old instance, before the new one is built
    gc.collect()
    plan.arm("step", KeyError)
    with pytest.raises(KeyError):
        faulty(1, log).step("b")
    zero.step("a")
    assert log == ["0:a"] and plan.fired == ["step"]


class Unhashable:
    """A worker whose instances cannot go in a set (`__eq__`, no `__hash__`)."""

    worker_index = -1

    def __init__(self, index: int) -> None:
        self.worker_index = index

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Unhashable) and other.worker_index == self.worker_index

    __hash__ = None  # type: ignore[assignment]

    def work(self) -> int:
        return self.worker_index


def test_workers_that_cannot_be_hashed_are_counted() -> None:
    plan = Plan()
    faulty = inject_faults(Unhashable, plan, {"p": "work"}, worker=1)
    zero, one = faulty(0), faulty(1)  # was (a WeakSet): TypeError, unhashable
    plan.arm("p", KeyError)
    assert zero.work() == 0
    with pytest.raises(KeyError):
        one.work()


def test_a_phase_another_place_can_fire_is_armed() -> None:
    plan, log = Plan(), []
    nowhere = inject_faults(Worker, plan, {"step": "step"}, worker=2)
    somewhere = inject_faults(Worker, plan, {"step": "step"}, worker=0)
    zero, one = nowhere(0, log), nowhere(1, log)
    plan.arm("step", KeyError)  # the other class's worker 0 may fire it
    zero.step("a")
    with pytest.raises(KeyError):
        somewhere(0, log).step("b")
    plan.declare("by hand")
    plan.arm("by hand", KeyError)  # a hand-written hook: fires anywhere
    assert log == ["0:a"] and one.step("c") == "c"


def test_a_phase_armed_before_the_workers_are_built_fails_their_first_pass() -> None:
    plan, log = Plan(), []
    faulty = inject_faults(Worker, plan, {"step": "step"}, worker=2)
    plan.arm("step", KeyError)  # nothing built yet: not known
    zero, one = faulty(0, log), faulty(1, log)
    with pytest.raises(ValueError, match="inject_faults: " + NO_WORKER_2):
        zero.step("a")  # was: ran, and the fault never fired
    assert log == [] and plan.armed("step") == 1 and plan.fired == []  # nothing changed
    plan.disarm("step")
    zero.step("b")
    one.step("c")
    assert log == ["0:b", "1:c"]


async def test_the_data_parallel_trainer_with_no_replica_k_says_so(
    actor_system: ActorSystem,
) -> None:
    devices, (x, y) = cpu_devices(2), batches(1)[0]
    model = Mlp([IN, 8, CLASSES], seed=3)
    after = Plan()
    faulty = inject_faults(ReplicaActor, after, {"compute": "compute_gradients"}, worker=5)
    options = DataParallelOptions(replica_class=faulty)
    dp = await DataParallelTrainer.spawn(actor_system, model, devices, CONFIG, options)
    with pytest.raises(ValueError, match=r"no worker 5 \(.*: 0, 1\)"):
        after.arm("compute", RuntimeError)  # was: armed, and every step trained unfaulted
    before = Plan()
    faulty = inject_faults(ReplicaActor, before, {"compute": "compute_gradients"}, worker=5)
    before.arm("compute", RuntimeError)
    options = DataParallelOptions(replica_class=faulty)
    dp = await DataParallelTrainer.spawn(actor_system, model, devices, CONFIG, options)
    weights = await dp.ask(GetReplicaWeights(), timeout=T)
    with pytest.raises(ValueError, match="no worker 5"):
        await dp.ask(Step(x, y), timeout=T)  # was: trained, unfaulted
    np.testing.assert_array_equal(await dp.ask(GetReplicaWeights(), timeout=T), weights)
    assert before.fired == [] and before.armed("compute") == 1


def test_a_class_reused_for_another_trainer_counts_only_that_trainers_workers() -> None:
    """The roster kept every index the class ever built: once a trainer with
    a worker 2 was gone, arming worker 2 for the next trainer (workers 0
    and 1) was accepted and never fired."""
    plan, log = Plan(), []
    faulty = inject_faults(Worker, plan, {"step": "step"}, worker=2)
    first = [faulty(index, log) for index in range(3)]  # the first trainer's workers
    plan.arm("step", KeyError)
    plan.disarm("step")
    del first
    gc.collect()  # the first trainer stopped
    zero, one = faulty(0, log), faulty(1, log)  # the class reused for a trainer of 2
    with pytest.raises(ValueError, match=NO_WORKER_2):
        plan.arm("step", KeyError)  # was: armed
    assert plan.armed("step") == 0
    zero.step("a")
    one.step("b")
    assert log == ["0:a", "1:b"] and plan.fired == []
    del zero, one
    gc.collect()
    plan.arm("step", KeyError)  # none alive: the next trainer's workers are not known yet
    with pytest.raises(KeyError):
        faulty(2, log).step("c")
