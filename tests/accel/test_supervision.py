"""device_supervisor_strategy: the decider, and the directives applied to a real DeviceActor."""

from __future__ import annotations

import pytest

from atomr.accel import (
    ContextPoisoned,
    DeviceActor,
    DriverError,
    KernelTimeout,
    OutOfMemory,
    Unrecoverable,
    device_supervisor_strategy,
)
from atomr.actor import Actor, ActorStoppedError, Directive, OneForOneStrategy, Props
from atomr.testkit import await_condition


@pytest.mark.parametrize(
    "error,directive",
    [
        (ContextPoisoned("x"), Directive.RESTART),
        (OutOfMemory("x"), Directive.RESUME),
        (Unrecoverable("x"), Directive.STOP),
        (DriverError("x"), Directive.ESCALATE),
        (KernelTimeout("x"), Directive.ESCALATE),
        (RuntimeError("x"), Directive.ESCALATE),
    ],
)
def test_decider(error, directive):
    strategy = device_supervisor_strategy()
    assert isinstance(strategy, OneForOneStrategy)
    assert strategy.decide(error) is directive


def _raise(exc: BaseException) -> None:
    raise exc


class Counter(DeviceActor):
    """A device actor with state: counts 'inc' messages; ('fail', exc) raises exc on the device."""

    def __init__(self) -> None:
        super().__init__("cpu:0")
        self.count = 0

    async def receive(self, message):
        if message == "inc":
            self.count += 1
            return self.count
        if message == "who":
            return id(self), self.count
        if isinstance(message, tuple) and message[0] == "fail":
            return await self.on_device(_raise, message[1])
        return await super().receive(message)


class Parent(Actor):
    """Spawns one Counter and supervises it with device_supervisor_strategy()."""

    def pre_start(self):
        self.child = self.context.spawn(Props(Counter), name="dev")

    def supervisor_strategy(self):
        return device_supervisor_strategy()

    def receive(self, message):
        return self.child


class Grandparent(Actor):
    """Records what its child (a Parent) escalated, then stops it."""

    def __init__(self, seen: list) -> None:
        super().__init__()
        self.seen = seen

    def pre_start(self):
        self.parent = self.context.spawn(Props(Parent), name="parent")

    def supervisor_strategy(self):
        def decide(error):
            self.seen.append(error)
            return Directive.STOP

        return OneForOneStrategy(decider=decide)

    def receive(self, message):
        return self.parent


async def _child(system, seen=None):
    grand = system.spawn(Props(Grandparent, seen if seen is not None else []))
    parent = await grand.ask("parent", timeout=5)
    return parent, await parent.ask("child", timeout=5)


async def test_out_of_memory_resumes_keeping_state(actor_system):
    _, child = await _child(actor_system)
    assert await child.ask("inc", timeout=5) == 1
    before = await child.ask("who", timeout=5)
    with pytest.raises(OutOfMemory) as info:
        await child.ask(("fail", MemoryError("boom")), timeout=5)
    assert isinstance(info.value.__cause__, MemoryError)
    assert await child.ask("who", timeout=5) == before  # same instance, same state
    assert await child.ask("inc", timeout=5) == 2


async def test_context_poisoned_restarts_with_a_fresh_instance(actor_system):
    _, child = await _child(actor_system)
    await child.ask("inc", timeout=5)
    first_id, _ = await child.ask("who", timeout=5)
    with pytest.raises(ContextPoisoned):
        await child.ask(("fail", ContextPoisoned("sticky")), timeout=5)
    new_id, count = await child.ask("who", timeout=5)
    assert count == 0 and new_id != first_id
    # the restarted instance has a working worker thread: the next failure is again an OutOfMemory
    with pytest.raises(OutOfMemory):
        await child.ask(("fail", MemoryError("again")), timeout=5)


async def test_unrecoverable_stops_the_actor(actor_system):
    _, child = await _child(actor_system)
    with pytest.raises(Unrecoverable):
        await child.ask(("fail", Unrecoverable("device lost")), timeout=5)
    await await_condition(lambda: not child.is_alive, message="the child stopped")
    with pytest.raises(ActorStoppedError):
        await child.ask("inc", timeout=5)


async def test_other_errors_escalate_to_the_grandparent(actor_system):
    seen: list = []
    parent, child = await _child(actor_system, seen)
    with pytest.raises(DriverError):
        await child.ask(("fail", KeyError("unexpected")), timeout=5)
    await await_condition(lambda: bool(seen), message="the grandparent saw the failure")
    assert len(seen) == 1 and isinstance(seen[0], DriverError)
    assert isinstance(seen[0].__cause__, KeyError)
