"""How a `PipelineParallelTrainer` is built: the checks `props` runs on its
arguments, and the stages `spawn` cuts a model into (one per device).

Both check everything before anything is spawned (`atomr.train._contract`):
a wrong type is a `TypeError` naming the argument, a setting the pipeline
cannot honour (gradient accumulation) a `ValueError`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from atomr.accel import Device
from atomr.actor import Props
from atomr.train._contract import (
    check_options,
    check_spawn_args,
    check_workers,
    refuse_accumulation,
)
from atomr.train.core.config import TrainerConfig
from atomr.train.core.model.sequential import Sequential
from atomr.train.pipeline.options import PipelineOptions
from atomr.train.pipeline.split import stage_layer_counts
from atomr.train.pipeline.stage import StageActor

__all__ = ["check_props", "spawn_stages"]


def spawn_stages(
    system: Any,
    model: Sequential,
    devices: Sequence[Device | str],
    config: TrainerConfig,
    options: PipelineOptions | None,
    name: str | None,
) -> tuple[TrainerConfig, list[Props], PipelineOptions]:
    """The checks of `PipelineParallelTrainer.spawn`, and the stages it spawns:
    `model` cut into one stage (`options.stage_class`) per device.

    Returns:
        `(config, one stage's Props per device in pipeline order, the options
        for props: no split and the built-in stage class)`.

    Raises:
        TypeError, ValueError: as `PipelineParallelTrainer.spawn`.
    """
    model, devs, config = check_spawn_args(system, model, devices, config, name)
    options = check_options(options, PipelineOptions, "PipelineParallelTrainer")
    refuse_accumulation(config, "pipeline")
    counts = stage_layer_counts(model, len(devs), options.split)
    stages, start = [], 0
    for count, dev in zip(counts, devs, strict=True):
        stages.append(options.stage_class.props(model.slice_layers(start, start + count), dev))
        start += count
    built = dataclasses.replace(options, split=None, stage_class=StageActor)
    return config, stages, built


def check_props(
    config: Any, stages: Any, options: Any
) -> tuple[TrainerConfig, list[Any], PipelineOptions]:
    """The checks of `PipelineParallelTrainer.props` (see the class).

    Raises:
        TypeError, ValueError: as `PipelineParallelTrainer.props`.
    """
    config, items = check_workers(config, stages, "stages")
    options = check_options(options, PipelineOptions, "PipelineParallelTrainer")
    refuse_accumulation(config, "pipeline")
    if options.split is not None or options.stage_class is not StageActor:
        raise ValueError(
            "options.split and options.stage_class say how spawn builds its stages; props "
            "takes stages already built: leave them None and StageActor"
        )
    return config, items, options
