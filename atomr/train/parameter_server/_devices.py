"""`parse_devices`: a sequence of devices given by the user, checked and parsed."""

from __future__ import annotations

from collections.abc import Sequence

from atomr.accel import Device

__all__ = ["parse_devices"]


def parse_devices(devices: object, name: str) -> tuple[Device, ...]:
    """Parse a non-empty sequence of `Device` or device names.

    Args:
        devices: the sequence.
        name: the argument's name, for the error messages.

    Returns:
        The devices.

    Raises:
        TypeError: not a sequence of `Device` or str (a single device included).
        ValueError: empty, or an unknown device name.
    """
    if isinstance(devices, (str, Device)) or not isinstance(devices, Sequence):
        raise TypeError(f"{name} must be a sequence of devices, e.g. ['cpu:0'], got {devices!r}")
    if not devices:
        raise ValueError(f"{name} must hold at least one device")
    try:
        return tuple(Device.parse(d) for d in devices)
    except TypeError as exc:
        raise TypeError(f"{name}: {exc}") from None
