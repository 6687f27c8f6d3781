"""The argument checks of the trainer contract, shared by the trainers'
`spawn` and `props`: each argument of the wrong type is a `TypeError` that
names it, and a `TrainerConfig` setting the strategy cannot honour is a
`ValueError`, raised before anything is spawned.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from atomr.accel import Device
from atomr.actor import ActorRef, ActorSystem, Context, Props
from atomr.train.core.config import TrainerConfig
from atomr.train.core.mlp import Mlp

__all__ = ["check_options", "check_spawn_args", "check_workers", "refuse_accumulation"]

OptionsT = TypeVar("OptionsT")


def check_options(options: OptionsT | None, options_type: type[OptionsT]) -> OptionsT:
    """The strategy's options, its defaults for None.

    Args:
        options: an `options_type` instance or None.
        options_type: the strategy's frozen options dataclass.

    Returns:
        `options`, or `options_type()` when it is None.

    Raises:
        TypeError: `options` is neither None nor an `options_type`.
    """
    if options is None:
        return options_type()
    if not isinstance(options, options_type):
        raise TypeError(
            f"options must be a {options_type.__name__} or None, got {type(options).__name__}"
        )
    return options


def _check_config(config: Any) -> TrainerConfig:
    if not isinstance(config, TrainerConfig):
        raise TypeError(f"config must be a TrainerConfig, got {type(config).__name__}")
    return config


def check_spawn_args(
    system: Any, model: Any, devices: Any, config: Any, name: Any
) -> tuple[Mlp, list[Device], TrainerConfig]:
    """Check the arguments every parallel trainer's `spawn` shares.

    Args:
        system: must be an `ActorSystem` or a `Context` (the trainer's parent).
        model: must be an `Mlp`.
        devices: a non-empty sequence (not a str) of `Device`s or device names.
        config: must be a `TrainerConfig`.
        name: the actor's name, a str or None.

    Returns:
        `(model, parsed devices, config)`.

    Raises:
        TypeError: an argument has the wrong type (the message names it).
        ValueError: no devices, or a device name that does not parse.
    """
    if not isinstance(system, ActorSystem | Context):
        raise TypeError(f"system must be an ActorSystem or a Context, got {type(system).__name__}")
    if not isinstance(model, Mlp):
        raise TypeError(f"model must be an Mlp, got {type(model).__name__}")
    if isinstance(devices, str | Device) or not isinstance(devices, Sequence):
        raise TypeError(
            f"devices must be a sequence of Devices or device names, got {type(devices).__name__}"
        )
    if not devices:
        raise ValueError("devices is empty: give at least one device")
    for device in devices:
        if not isinstance(device, str | Device):
            raise TypeError(
                f"devices must hold Devices or device names, got {type(device).__name__}"
            )
    parsed = [Device.parse(d) for d in devices]
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name must be a str or None, got {type(name).__name__}")
    return model, parsed, _check_config(config)


def check_workers(config: Any, workers: Any, what: str) -> tuple[TrainerConfig, list[Any]]:
    """Check the arguments of a trainer's `props`: its config and the workers
    the user built.

    Args:
        config: must be a `TrainerConfig`.
        workers: a non-empty sequence of `ActorRef`s, or one of `Props` (the
            trainer spawns those as its children); not a mix.
        what: the workers' name in messages ("shards", "stages").

    Returns:
        `(config, the workers as a list)`.

    Raises:
        TypeError: `config` is not a `TrainerConfig`, `workers` is not a
            sequence, or it holds something other than all `ActorRef`s or all
            `Props`.
        ValueError: `workers` is empty.
    """
    config = _check_config(config)
    if not isinstance(workers, Sequence) or isinstance(workers, str):
        raise TypeError(f"{what} must be a sequence, got {type(workers).__name__}")
    items = list(workers)
    if not items:
        raise ValueError(f"{what} is empty: give at least one")
    if all(isinstance(w, ActorRef) for w in items) or all(isinstance(w, Props) for w in items):
        return config, items
    kinds = sorted({type(w).__name__ for w in items})
    raise TypeError(f"{what} must all be ActorRefs or all be Props, got {', '.join(kinds)}")


def refuse_accumulation(config: TrainerConfig, strategy: str) -> None:
    """Refuse `config.accumulation_steps > 1` for a strategy that cannot accumulate.

    Args:
        config: the trainer's config.
        strategy: the strategy's name, for the message ("tensor-parallel").

    Raises:
        ValueError: `config.accumulation_steps` is above 1.
    """
    if config.accumulation_steps > 1:
        raise ValueError(
            f"the {strategy} trainer does not accumulate gradients across Steps, but "
            f"config.accumulation_steps is {config.accumulation_steps}: use 1 and a larger batch"
        )
