"""`setup`: one call that finds the devices and spawns the trainer; its
`devices` are checked as every trainer's `spawn` checks them."""

from __future__ import annotations

import io

import pytest

from atomr import ActorSystem
from atomr.train import Mlp, setup


@pytest.mark.parametrize(
    ("devices", "error", "needle"),
    [
        (2, TypeError, "devices must be a sequence of Device or device names"),
        ("cpu:0", TypeError, "devices must be a sequence of Device or device names"),
        ([], ValueError, "devices is empty"),
        ([0], TypeError, r"devices\[0\] must be a Device or a device name"),
    ],
)
async def test_devices_are_checked_as_spawn_checks_them(
    devices: object, error: type[Exception], needle: str
) -> None:
    """`devices=2` was "'int' object is not iterable", and "cpu:0" was read
    letter by letter ("unknown device 'c'")."""
    out = io.StringIO()
    async with ActorSystem("setup") as system:
        with pytest.raises(error, match=needle):
            await setup(system, Mlp([4, 2]), devices=devices, out=out)  # type: ignore[arg-type]
    assert out.getvalue() == ""


async def test_given_devices_pick_the_trainer_and_the_line_names_them() -> None:
    out = io.StringIO()
    async with ActorSystem("setup") as system:
        await setup(system, Mlp([4, 2]), devices=["cpu:0", "cpu:1"], out=out)
        await setup(system, Mlp([4, 2]), devices=["cpu:0"], out=out)
    first, second = out.getvalue().splitlines()
    assert first.startswith("atomr: 2 logical CPU devices (cpu:0, cpu:1): DataParallelTrainer")
    assert second.startswith("atomr: 1 logical CPU device (cpu:0): Trainer")
