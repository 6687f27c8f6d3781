"""Every worker protocol (the data-parallel replica, both tensor-parallel
shards, the pipeline stage, the ZeRO replica, the parameter-server shard and
worker) lists exactly the messages its built-in actor answers, documents
every one of them, and is exported by its package.

What an actor answers is found by sending it one instance of every message
class of `atomr.train` (fields left None): the built-in actors refuse a
message they do not handle with `Failure(TypeError("... does not handle
..."))` before touching anything, and any other outcome (a reply, a
`Failure` about the blank fields) means the actor dispatched it."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest

import atomr.train
from atomr import ActorSystem, Props
from atomr.accel import cpu_devices
from atomr.actor import ActorRef
from atomr.train import (
    LossKind,
    Mlp,
    OptimizerKind,
    Step,
    TensorParallelOptions,
    TensorParallelTrainer,
    Trainer,
    TrainerConfig,
)
from atomr.train.comm.ring import RingMember
from atomr.train.core.model import gpt
from atomr.train.data_parallel import ReplicaActor, ReplicaProtocol
from atomr.train.parameter_server import (
    ParameterServerWorker,
    ParameterServerWorkerProtocol,
    ServerShard,
    ServerShardProtocol,
)
from atomr.train.pipeline import PipelineStageProtocol, StageActor
from atomr.train.pipeline.messages import ConnectStage
from atomr.train.sharded import ShardedReplica, ShardedReplicaProtocol
from atomr.train.sharded.layout import ShardLayout
from atomr.train.tensor_parallel import (
    LayerShardActor,
    LayerShardProtocol,
    ShardActor,
    ShardProtocol,
)

CONFIG = TrainerConfig(OptimizerKind.sgd(0.1), LossKind.CROSS_ENTROPY, worker_timeout=5.0)
MODEL = Mlp([4, 4, 2], seed=0)
DEVICE = cpu_devices(1)[0]
Spawner = Callable[[ActorSystem], Awaitable[ActorRef]]


def _message_classes() -> list[type]:
    """Every dataclass defined in a messages module of `atomr.train`."""
    found: list[type] = []
    for info in pkgutil.walk_packages(atomr.train.__path__, "atomr.train."):
        if not info.name.endswith("messages"):
            continue
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            defined_here = getattr(value, "__module__", None) == module.__name__
            if inspect.isclass(value) and dataclasses.is_dataclass(value) and defined_here:
                found.append(value)
    return sorted(found, key=lambda c: (c.__module__, c.__name__))


def _blank(cls: type) -> Any:
    """An instance of the message class with every field None (no checks run)."""
    message: Any = object.__new__(cls)
    for field in dataclasses.fields(cls):
        object.__setattr__(message, field.name, None)
    return message


async def _answered(system: ActorSystem, spawn: Spawner) -> set[type]:
    """The message classes the actor `spawn` starts does not refuse; a fresh
    actor after each answered one (a blank message may leave it waiting)."""
    answered: set[type] = set()
    ref = await spawn(system)
    for cls in _message_classes():
        try:
            await ref.ask(_blank(cls), timeout=10)
        except TypeError as exc:
            if "does not handle" in str(exc):
                continue
        except Exception:  # noqa: S110 - any other failure: it was dispatched
            pass
        answered.add(cls)
        ref.stop()
        ref = await spawn(system)
    return answered


def _direct(props: Callable[[], Props], *setup: Any) -> Spawner:
    async def spawn(system: ActorSystem) -> ActorRef:
        ref = system.spawn(props())
        for message in setup:
            await ref.ask(message, timeout=30)
        return ref

    return spawn


class _RecordedLayerShard(LayerShardActor):
    """The built-in layer shard, which tells the test its ref when it starts."""

    started: list[ActorRef] = []

    def pre_start(self) -> None:
        super().pre_start()
        self.started.append(self.context.self_ref)


async def _layer_shard(system: ActorSystem) -> ActorRef:
    model = gpt(5, 3, n_layer=1, d_model=4, n_head=2, seed=0)
    options = TensorParallelOptions(layer_shard_class=_RecordedLayerShard)
    await TensorParallelTrainer.spawn(system, model, cpu_devices(1), CONFIG, options)
    return _RecordedLayerShard.started[-1]


async def _ps_worker(system: ActorSystem) -> ActorRef:
    n = MODEL.n_params
    server = system.spawn(ServerShard.props(MODEL.get_params(), OptimizerKind.sgd(0.1)))
    props = ParameterServerWorker.props(0, MODEL, DEVICE, CONFIG, [server], [(0, n)])
    return system.spawn(props)


def _sharded(stage: int) -> Spawner:
    layout = ShardLayout.for_model(MODEL, stage, 1)
    return _direct(lambda: Props(ShardedReplica, MODEL, DEVICE, CONFIG, stage, layout, 0))


async def _beyond_a_replica(system: ActorSystem) -> set[type]:
    """What a data-parallel replica answers besides its protocol, by design:
    the single-device `Trainer`'s messages but `Step`, and the ring's."""
    trainer = _direct(lambda: Props(Trainer, MODEL, DEVICE, CONFIG))
    rings = {cls for cls in _message_classes() if RingMember.handles(_blank(cls))}
    return (await _answered(system, trainer)) - {Step} | rings


CASES: list[tuple[type, type, Spawner]] = [
    (ReplicaProtocol, ReplicaActor, _direct(lambda: Props(ReplicaActor, MODEL, DEVICE, CONFIG))),
    (ShardProtocol, ShardActor, _direct(lambda: ShardActor.props(MODEL, 0, 1, DEVICE))),
    (LayerShardProtocol, LayerShardActor, _layer_shard),
    (
        PipelineStageProtocol,
        StageActor,
        _direct(
            lambda: StageActor.props(MODEL, DEVICE),
            ConnectStage(0, 1, None, None, CONFIG.optimizer),
        ),
    ),
    (ShardedReplicaProtocol, ShardedReplica, _sharded(1)),
    (ServerShardProtocol, ServerShard, _direct(lambda: ServerShard.props(np.zeros(4), 0.1))),
    (ParameterServerWorkerProtocol, ParameterServerWorker, _ps_worker),
]
IDS = [case[0].__name__ for case in CASES]


def _names(types: set[type]) -> list[str]:
    return sorted(t.__name__ for t in types)


@pytest.mark.parametrize(("protocol", "actor", "spawn"), CASES, ids=IDS)
async def test_protocol_lists_what_the_builtin_actor_answers(
    protocol: type, actor: type, spawn: Spawner
) -> None:
    listed = set(protocol.messages)  # type: ignore[attr-defined]
    assert len(listed) == len(protocol.messages), "a message is listed twice"  # type: ignore[attr-defined]
    async with ActorSystem("protocols") as system:
        answered = await _answered(system, spawn)
        beyond = await _beyond_a_replica(system) if actor is ReplicaActor else set()
    assert _names(listed - answered) == [], f"listed but refused by {actor.__name__}"
    assert _names(answered - listed - beyond) == [], f"answered by {actor.__name__}, not listed"


async def test_a_stage_3_replica_answers_its_own_passes() -> None:
    """The ZeRO case above runs stage 1; stage 3 answers the same protocol."""
    async with ActorSystem("protocols") as system:
        answered = await _answered(system, _sharded(3))
    assert answered == set(ShardedReplicaProtocol.messages)


async def test_the_probe_sees_a_refused_message() -> None:
    """The probe tells an answered message from a refused one."""
    async with ActorSystem("protocols") as system:
        answered = await _answered(system, _direct(lambda: ServerShard.props(np.zeros(4), 0.1)))
    assert answered and len(answered) < len(_message_classes())


@pytest.mark.parametrize(("protocol", "actor", "spawn"), CASES, ids=IDS)
def test_protocol_documents_every_message(protocol: type, actor: type, spawn: Spawner) -> None:
    doc = inspect.getdoc(protocol) or ""
    rows = [line for line in doc.splitlines() if line.startswith("| `")]
    for message in protocol.messages:  # type: ignore[attr-defined]
        assert any(f"`{message.__name__}(" in row for row in rows), message.__name__
    assert actor.__name__ in doc


@pytest.mark.parametrize(("protocol", "actor", "spawn"), CASES, ids=IDS)
def test_protocol_and_actor_are_exported(protocol: type, actor: type, spawn: Spawner) -> None:
    package = importlib.import_module(actor.__module__.rsplit(".", 1)[0])
    for cls in (protocol, actor):
        assert cls.__name__ in package.__all__
        assert getattr(package, cls.__name__) is cls
    messages_module = importlib.import_module(protocol.__module__)
    assert protocol.__name__ in messages_module.__all__
