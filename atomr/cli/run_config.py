"""`RunConfig`: the validated options of one `atomr train` run.

Every check that can fail on user input happens when it is built
(`RunConfig.from_args`, with the checks in run_args.py), before an actor is
spawned, and fails with a `CliError` that says what to change.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from atomr.accel import Device
from atomr.cli.model_options import GptShape
from atomr.cli.optimizer_options import update_rule
from atomr.cli.run_args import checked_fields
from atomr.train import TrainerConfig
from atomr.train.comm.mpi.job import DistributedTrainConfig
from atomr.train.core.schedule import (
    CosineAnnealingLR,
    LinearLR,
    LrSchedule,
    SequentialLR,
    StepLR,
)

__all__ = ["RunConfig"]


@dataclass(frozen=True)
class RunConfig:
    """Everything one training run needs, checked.

    Attributes mirror the `atomr train` options (see `atomr train --help`);
    `devices` is resolved to `Device`s and `hidden` to widths, `lr` to the
    optimizer's default when not given.
    """

    strategy: str
    devices: tuple[Device, ...]
    hidden: tuple[int, ...]
    activation: str
    schedule: str | None
    micro_batch_size: int | None
    workers: int | None
    distributed: bool
    epochs: int
    batch_size: int
    optimizer: str
    lr: float
    momentum: float
    loss: str
    clip: float | None
    seed: int
    lr_schedule: str
    warmup_epochs: int
    max_steps: int | None
    policy: str | None
    average_every: int | None
    zero_stage: int | None
    dataset: str
    samples: int
    features: int
    classes: int
    checkpoint: Path | None
    resume: Path | None
    run_dir: Path | None
    name: str | None
    plot: Path | None
    history: Path | None
    metrics: Path | None
    tensorboard: Path | None
    quiet: bool
    dist: DistributedTrainConfig | None = None
    model: str = "mlp"
    gpt: GptShape | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RunConfig:
        """Check the parsed `atomr train` arguments and resolve the defaults.

        Raises:
            CliError: any option out of range or inconsistent with another.
        """
        return cls(**checked_fields(args))

    def lr_schedule_for(self, steps_per_epoch: int) -> LrSchedule | None:
        """The learning-rate schedule of `--lr-schedule` and `--warmup-epochs`
        over `epochs * steps_per_epoch` updates (None: constant)."""
        total = self.epochs * steps_per_epoch
        warm = self.warmup_epochs * steps_per_epoch
        after: LrSchedule | None = None
        if self.lr_schedule == "cosine":
            after = CosineAnnealingLR(total - warm)
        elif self.lr_schedule == "step":
            after = StepLR(max(1, math.ceil((total - warm) / 3)), 0.1)  # two cuts, not three
        if not warm:
            return after
        warmup = LinearLR(0.1, 1.0, warm)
        if after is None:
            return warmup
        return SequentialLR((warmup, after), (warm,))

    def trainer_config(self, steps_per_epoch: int = 1) -> TrainerConfig:
        """The `TrainerConfig` (optimizer, loss, clipping, learning-rate
        schedule over `steps_per_epoch` updates an epoch) of this run."""
        return update_rule(
            self.optimizer,
            self.lr,
            self.momentum,
            self.loss,
            self.clip,
            schedule=self.lr_schedule_for(steps_per_epoch),
            max_steps=self.max_steps,
        )

    def data_options(self) -> dict[str, Any]:
        """The options that fix the data and its order (a resumed run must match them)."""
        keys = ["dataset", "seed", "batch_size"]
        if self.dataset == "synthetic":
            keys += ["samples", "features", "classes"]
        return {k: getattr(self, k) for k in keys}

    def to_json(self) -> dict[str, Any]:
        """The options as JSON-friendly values (for the history file)."""
        out = asdict(self)
        out["devices"] = [str(d) for d in self.devices]
        if self.dist is not None:
            out["dist"] = {"world_size": self.dist.world_size, "rank": self.dist.rank}
        out["hidden"] = list(self.hidden)
        for key, value in out.items():
            if isinstance(value, Path):
                out[key] = str(value)
        return out
