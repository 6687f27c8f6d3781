"""How a `DataParallelTrainer` is built: the checks `props` runs on its
arguments, the replicas `spawn` starts (one per device) and the collective
the trainer makes from its options.

Everything is checked before anything is spawned (`atomr.train._contract`):
a wrong type is a `TypeError` naming the argument, a setting the trainer
cannot honour a `ValueError`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from atomr.accel import Device
from atomr.actor import ActorRef, Props
from atomr.train._contract import (
    check_config,
    check_options,
    check_spawn_args,
    refuse_accumulation,
)
from atomr.train.comm.collective import Collective, HostCollective
from atomr.train.comm.ring import RingCollective
from atomr.train.core.config import TrainerConfig
from atomr.train.core.model.sequential import Sequential
from atomr.train.data_parallel.options import ApplyPolicy, DataParallelOptions
from atomr.train.data_parallel.replica import ReplicaActor, worker_deadline

__all__ = ["check_props", "made_collective", "spawn_replicas"]


def made_collective(options: DataParallelOptions, config: TrainerConfig) -> tuple[Collective, bool]:
    """The collective `options.collective` names (or is), and whether the
    trainer made it (and so closes it; one it was given is the caller's)."""
    if isinstance(options.collective, Collective):
        return options.collective, False
    if options.collective == "host":
        return HostCollective(), True
    return RingCollective(worker_deadline(config)), True


def check_props(
    config: object, replicas: object, options: object
) -> tuple[TrainerConfig, list[ActorRef | Props], DataParallelOptions]:
    """The trainer's arguments, checked (see `DataParallelTrainer`); None
    options become the defaults.

    Raises:
        TypeError: an argument has the wrong type.
        ValueError: `options.speed_hint` does not have one entry per replica,
            ASYNC with gradient accumulation, or an `options.replica_class`
            other than `ReplicaActor` (it is for `spawn`).
    """
    trainer_config = check_config(config)
    if not isinstance(replicas, Sequence):
        raise TypeError(f"replicas must be a sequence, got {type(replicas).__name__}")
    for k, r in enumerate(replicas):
        if not isinstance(r, ActorRef | Props):
            raise TypeError(f"replicas[{k}] must be an ActorRef or Props, got {type(r).__name__}")
    check_options(options, DataParallelOptions, "DataParallelTrainer")
    checked = options if isinstance(options, DataParallelOptions) else DataParallelOptions()
    if checked.replica_class is not ReplicaActor:
        raise ValueError(
            "options.replica_class is how spawn builds its replicas; props takes replicas "
            "already built: leave it ReplicaActor"
        )
    if replicas:
        checked.replica_count_fits(len(replicas))
    if checked.policy is not ApplyPolicy.SYNC:
        refuse_accumulation(trainer_config, f"data-parallel (ApplyPolicy.{checked.policy.name})")
    return trainer_config, list(replicas), checked


def spawn_replicas(
    system: Any,
    model: Sequential,
    devices: Sequence[Device | str],
    config: TrainerConfig,
    options: DataParallelOptions | None,
    name: str | None,
    trainer: str = "DataParallelTrainer",
) -> tuple[TrainerConfig, list[Props], DataParallelOptions]:
    """`spawn`'s arguments checked, and the `Props` of one replica
    (`options.replica_class`) of `model` per device, numbered in device order;
    the options returned are those the trainer's `props` takes. `trainer`
    names the class in a message about its options.

    Raises:
        TypeError: an argument has the wrong type; the message names it.
        ValueError: no devices, a bad device name, CPU and CUDA devices
            mixed, or options the trainer refuses.
    """
    model, devs, config = check_spawn_args(system, model, devices, config, name)
    options = check_options(options, DataParallelOptions, trainer)
    if len({d.kind for d in devs}) > 1:
        raise ValueError(
            f"devices {[str(d) for d in devs]} mix CPU and CUDA; their kernels round "
            "differently, so the replicas would not stay bit-identical: put every "
            "replica on the same kind of device"
        )
    rc = options.replica_class
    replica_props = [rc.props(model, d, config, index=k) for k, d in enumerate(devs)]
    return config, replica_props, dataclasses.replace(options, replica_class=ReplicaActor)
