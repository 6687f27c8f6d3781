"""How a `ShardedDataParallelTrainer` is built: the checks of its `props`
(`check_props`), and the layout and replica `Props` its `spawn` makes from
a model and devices (`spawn_parts`), which then go through the same checks.
"""

from __future__ import annotations

from typing import Any

from atomr.accel import Device
from atomr.actor import ActorRef, Props
from atomr.train._contract import check_model, check_workers, refuse_accumulation
from atomr.train.core.config import TrainerConfig
from atomr.train.core.model.sequential import Sequential
from atomr.train.sharded.layout import ShardLayout
from atomr.train.sharded.options import ShardedOptions
from atomr.train.sharded.replica import ShardedReplica

__all__ = ["check_props", "refuse_job_options", "spawn_parts"]


def refuse_job_options(options: ShardedOptions) -> None:
    """What only `spawn` can do, refused for `props`.

    Raises:
        ValueError: a `process_collective` (a job of several processes:
            `spawn` has them agree that all started and take process 0's
            weights), or a `replica_class` other than `ShardedReplica` (it
            is how `spawn` builds replicas; `props` takes them built).
    """
    if options.process_collective is not None:
        raise ValueError(
            "props builds the trainer of one process; in a multi-process job "
            "(options.process_collective) use spawn, which has every process agree that "
            "all started and take process 0's weights"
        )
    if options.replica_class is not ShardedReplica:
        raise ValueError(
            "options.replica_class is how spawn builds its replicas; props takes replicas "
            "already built: leave it ShardedReplica"
        )


def check_props(
    model: Any, replicas: Any, config: Any, layout: Any, options: ShardedOptions
) -> tuple[Sequential, list[Props], TrainerConfig, ShardLayout, ShardedOptions]:
    """The trainer's arguments, checked (see `ShardedDataParallelTrainer.props`).

    Returns:
        The trainer's arguments: `(model, the replicas' Props as a list,
        config, layout, options)`.

    Raises:
        TypeError: `model` is not a `Sequential`, `config` not a
            `TrainerConfig`, `replicas` not a sequence of `Props` (an
            `ActorRef` included: the trainer spawns and supervises its
            replicas), or `layout` not a `ShardLayout`.
        ValueError: no replicas, `config.accumulation_steps > 1`, an optimizer
            hyperparameter out of range in the model's dtype, a replica that
            would own no parameter, or a layout other than the one the
            trainer splits with (`ShardLayout.for_model` of the model, the
            stage, the replicas and the job).
    """
    checked = check_model(model)
    conf, items = check_workers(config, replicas, "replicas")
    conf.check_dtype(checked.dtype)
    refuse_accumulation(conf, "sharded data-parallel")
    if isinstance(items[0], ActorRef):
        raise TypeError(
            "replicas must be Props, got ActorRef: the sharded trainer spawns its replicas "
            "as its children (it supervises them; a lost piece is its to restore)"
        )
    if not isinstance(layout, ShardLayout):
        raise TypeError(f"layout must be a ShardLayout, got {type(layout).__name__}")
    o = options
    fits = ShardLayout.for_model(checked, o.stage, len(items), o.process_count, o.process_rank)
    if layout != fits:
        raise ValueError(
            f"layout ({_described(layout)}) is not the one the trainer splits with "
            f"({_described(fits)}): build it, and the replicas' Props with it, as "
            f"ShardLayout.for_model(model, {o.stage}, {len(items)}, {o.process_count}, "
            f"{o.process_rank})"
        )
    return checked, items, conf, layout, options


def _described(layout: ShardLayout) -> str:
    """A layout in a few words (a stage-3 one has a unit per layer)."""
    return (
        f"{len(layout.units)} unit(s) of {layout.units[-1][1] if layout.units else 0} "
        f"parameters, {layout.replicas} replica(s), process {layout.process_rank} of "
        f"{layout.processes}"
    )


def spawn_parts(
    model: Sequential, devices: list[Device], config: TrainerConfig, options: ShardedOptions
) -> tuple[list[Props], ShardLayout]:
    """`spawn`'s replicas: one `options.replica_class` per device, and the
    layout they share.

    Raises:
        ValueError: CPU and CUDA devices mixed, or a replica that would own
            no parameter (`ShardLayout.for_model`).
    """
    if len({d.kind for d in devices}) > 1:
        raise ValueError("devices mix CPU and CUDA: their kernels round differently")
    o = options
    layout = ShardLayout.for_model(model, o.stage, len(devices), o.process_count, o.process_rank)
    replicas = [
        Props(o.replica_class, model, d, config, o.stage, layout, k) for k, d in enumerate(devices)
    ]
    return replicas, layout
