"""`setup`: find the devices, choose the trainer, say what was found (flodl's
one-call `Ddp::setup`)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, TextIO

from atomr.accel import Device, training_devices
from atomr.actor import ActorRef
from atomr.train._contract import parse_devices
from atomr.train.core.config import TrainerConfig
from atomr.train.core.loss import LossKind
from atomr.train.core.optimizer import OptimizerKind
from atomr.train.data_parallel.trainer import DataParallelTrainer
from atomr.train.trainer import Trainer

__all__ = ["setup"]


async def setup(
    system: Any,
    model: Any,
    optimizer: OptimizerKind | None = None,
    loss: LossKind = LossKind.CROSS_ENTROPY,
    *,
    config: TrainerConfig | None = None,
    devices: Sequence[Device | str] | None = None,
    out: TextIO | None = sys.stdout,
) -> ActorRef:
    """A ready trainer for `model` on what this machine has, in one call.

    The devices are every CUDA device, else two logical CPU devices
    (`atomr.accel.training_devices`); with more than one a
    `DataParallelTrainer` replicates the model over them, with one a `Trainer`.
    One line says what was found.

    Args:
        system: the `ActorSystem`.
        model: the model to train (its weights are the initial weights).
        optimizer: the update rule (default: `OptimizerKind.adam(1e-3)`);
            ignored when `config` is given.
        loss: the loss (ignored when `config` is given).
        config: the whole `TrainerConfig`, instead of `optimizer` and `loss`.
        devices: use these instead of looking (a sequence of `Device`s or
            device names, as every trainer's `spawn` takes).
        out: where the summary line goes (None: say nothing).

    Returns:
        The trainer's `ActorRef` (it answers `Step`, `Evaluate`, ...).

    Raises:
        TypeError, ValueError: as the trainers' `spawn` for bad arguments
            (`devices` that is no sequence of devices, such as `2` or
            "cpu:0", or an empty one, before anything is spawned).
    """
    if config is None:
        config = TrainerConfig(optimizer or OptimizerKind.adam(1e-3), loss)
    found = parse_devices(devices) if devices is not None else training_devices()
    trainer: Any = DataParallelTrainer if len(found) > 1 else Trainer
    ref = await trainer.spawn(system, model, list(found), config)
    if out is not None:
        kinds = "GPU" if found[0].is_cuda else "logical CPU device"
        plural = "s" if len(found) > 1 else ""
        names = ", ".join(map(str, found))
        print(
            f"atomr: {len(found)} {kinds}{plural} ({names}): {trainer.__name__}, "
            f"{config.optimizer.name} lr {config.optimizer.lr:g}",
            file=out,
        )
    return ref
