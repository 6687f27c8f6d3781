"""Helpers shared by the parameter-server trainer tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from atomr.actor import ActorRef
from atomr.testkit import await_condition
from atomr.train import GetWeights, LossKind, Mlp, OptimizerKind, TrainerConfig
from atomr.train.parameter_server import (
    AsyncParameterServer,
    GetServerStats,
    ParameterServerOptions,
    ParameterServerStats,
    ParameterServerWorker,
    ServerShard,
)
from atomr.train.parameter_server.messages import PullWeights, PushGradient
from tests.reliability.faults import CLASSES, IN

SIZES = [64, 32, 10]
T = 60.0  # seconds per ask

# 6*8 + 8 + 8*3 + 3 = 83 weights: two shards of 42 and 41
TWO_RANGE_SIZES = [IN, 8, CLASSES]
FIRST_RANGE = 42


def config(kind: OptimizerKind | None = None, **kw: Any) -> TrainerConfig:
    """Cross-entropy with `kind` (default: SGD 0.1)."""
    return TrainerConfig(kind or OptimizerKind.sgd(0.1), LossKind.CROSS_ENTROPY, **kw)


def batches(steps: int, batch: int, seed: int = 0) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """`steps` random classification batches for `SIZES`."""
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        x = rng.standard_normal((batch, SIZES[0])).astype(np.float32)
        yield x, rng.integers(0, SIZES[-1], size=batch)


async def spawn(
    system: Any, model: Mlp, devices: list[str], cfg: TrainerConfig, **options: Any
) -> ActorRef:
    """`AsyncParameterServer.spawn` with `ParameterServerOptions(**options)`."""
    return await AsyncParameterServer.spawn(
        system, model, devices, cfg, ParameterServerOptions(**options)
    )


async def server_stats(ps: ActorRef) -> list[ParameterServerStats]:
    """Every server shard's stats."""
    stats: list[ParameterServerStats] = await ps.ask(GetServerStats(), timeout=T)
    return stats


async def weights(ref: ActorRef) -> np.ndarray:
    """A trainer's flat weights."""
    return np.asarray(await ref.ask(GetWeights(), timeout=T))


class NumberedShard(ServerShard):
    """A server shard of a `TWO_RANGE_SIZES` model cut in two, telling
    `inject_faults(worker=...)` which range it holds (0: the first, longer
    one; 1: the second)."""

    @property
    def worker_index(self) -> int:
        return 0 if self.n == FIRST_RANGE else 1


class Gate:
    """Makes server shard 1 (of a `GatedShard` pair) take its first push
    after `arm` only once `until()` holds (checked for up to `T` seconds),
    while shard 0 notes whose pushes and pulls it received (`seen`): a test
    then lets another worker's push or pull reach shard 0 while the first
    push is applied there but not yet kept or undone.

    Attributes:
        seen: the workers whose push or pull shard 0 received since `arm`.
        received: every message shard 0 received since `arm`.
        held: the worker whose push shard 1 held, once it did.
    """

    def __init__(self) -> None:
        self.seen: list[int] = []
        self.received: list[Any] = []
        self.held: int | None = None
        self._until: Callable[[], bool] | None = None

    def arm(self, until: Callable[[], bool] | None = None) -> None:
        """Hold shard 1's next push until `until()` (default: shard 0 received
        a push or pull of a worker other than the held one)."""
        self.seen, self.received, self.held = [], [], None
        self._until = until or self.another_came

    def another_came(self) -> bool:
        """True once shard 0 received a push or pull of a worker other than the held one."""
        return any(w != self.held for w in self.seen)

    async def note(self, shard: int, message: Any) -> None:
        """What shard `shard` does with `message` before it handles it."""
        if self._until is None:
            return
        if shard == 0:
            self.received.append(message)
            if isinstance(message, (PushGradient, PullWeights)):
                self.seen.append(message.worker)
        elif isinstance(message, PushGradient) and self.held is None:
            self.held = message.worker
            await await_condition(self._until, timeout=T, message="the gate opened")
            self._until = None


GATE = Gate()
"""The gate of every `GatedShard` (tests run one at a time)."""


class GatedShard(NumberedShard):
    """A `NumberedShard` that passes every message by `GATE` first."""

    async def receive(self, message: Any) -> Any:
        await GATE.note(self.worker_index, message)
        return await super().receive(message)


class KnownWorker(ParameterServerWorker):
    """A worker that lists its own ref by its id (`refs`), so a test may ask
    it directly."""

    refs: dict[int, ActorRef] = {}

    def pre_start(self) -> None:
        super().pre_start()
        KnownWorker.refs[self.worker_id] = self.context.self_ref
