"""Helpers shared by the parameter-server trainer tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from atomr.actor import ActorRef
from atomr.train import GetWeights, LossKind, Mlp, OptimizerKind, TrainerConfig
from atomr.train.parameter_server import (
    AsyncParameterServer,
    GetServerStats,
    ParameterServerOptions,
    ParameterServerStats,
    ServerShard,
)
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
