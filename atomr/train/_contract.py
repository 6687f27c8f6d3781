"""The argument checks of the trainer contract, shared by every trainer:
`X.spawn(system, model, devices, config, options=None, name=None)` and
`X.props(...)`.

Each check raises before anything is spawned: `TypeError` naming the
argument for a wrong type, `ValueError` for a value out of range.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from atomr.accel import Device
from atomr.actor import ActorSystem, Context
from atomr.train.core.config import TrainerConfig
from atomr.train.core.mlp import Mlp

__all__ = [
    "check_config",
    "check_model",
    "check_name",
    "check_options",
    "check_system",
    "parse_devices",
]


def _kind(value: object) -> str:
    return type(value).__name__


def check_system(system: object) -> None:
    """Raises: TypeError: `system` is neither an `ActorSystem` nor a `Context`."""
    if not isinstance(system, ActorSystem | Context):
        raise TypeError(f"system must be an ActorSystem or a Context, got {_kind(system)}")


def check_model(model: object) -> Mlp:
    """Returns: `model`. Raises: TypeError: it is not an `Mlp`."""
    if not isinstance(model, Mlp):
        raise TypeError(f"model must be an Mlp, got {_kind(model)}")
    return model


def check_config(config: object) -> TrainerConfig:
    """Returns: `config`. Raises: TypeError: it is not a `TrainerConfig`."""
    if not isinstance(config, TrainerConfig):
        raise TypeError(f"config must be a TrainerConfig, got {_kind(config)}")
    return config


def check_options(options: object, expected: type | None, trainer: str) -> None:
    """Check a trainer's `options` argument.

    Args:
        options: what the caller passed.
        expected: the trainer's options class, or None for a trainer that
            has no options of its own (then only None is accepted).
        trainer: the trainer's name, for the message.

    Raises:
        TypeError: `options` is neither None nor an instance of `expected`.
    """
    if options is None:
        return
    if expected is None:
        raise TypeError(
            f"{trainer} has no options of its own (everything it takes is in "
            f"TrainerConfig): pass options=None, got {_kind(options)}"
        )
    if not isinstance(options, expected):
        raise TypeError(f"options must be a {expected.__name__} or None, got {_kind(options)}")


def check_name(name: object) -> None:
    """Raises: TypeError: `name` is neither None nor a str."""
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name must be a str or None, got {_kind(name)}")


def parse_devices(devices: Any, *, single: bool = False) -> list[Device]:
    """The devices a trainer was given, parsed.

    Args:
        devices: a sequence of `Device`s or device names; with `single`,
            also one `Device` or name.
        single: the trainer runs on exactly one device.

    Returns:
        The devices, in order (exactly one with `single`).

    Raises:
        TypeError: `devices` is not a sequence (a lone name or `Device`
            where a sequence is needed included), or an entry is neither a
            `Device` nor a str.
        ValueError: no devices, more than one with `single`, or a bad
            device name.
    """
    if single and isinstance(devices, Device | str):
        devices = [devices]
    if isinstance(devices, str | Device) or not isinstance(devices, Sequence):
        raise TypeError(
            f"devices must be a sequence of Device or device names (e.g. cpu_devices(2)), "
            f"got {_kind(devices)}"
        )
    for k, device in enumerate(devices):
        if not isinstance(device, Device | str):
            raise TypeError(f"devices[{k}] must be a Device or a device name, got {_kind(device)}")
    if not devices:
        raise ValueError("devices is empty: give at least one device")
    if single and len(devices) != 1:
        raise ValueError(
            f"this trainer runs on one device, got {len(devices)}: use a parallel "
            "trainer (e.g. DataParallelTrainer) for several"
        )
    return [Device.parse(d) for d in devices]
