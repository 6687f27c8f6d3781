"""`list_devices_command`: what `atomr devices` prints."""

from __future__ import annotations

import json
import os

from atomr.accel import cuda_device_count, cuda_is_simulated, list_devices
from atomr.accel.cuda_target import cuda_target
from atomr.cli.summary import format_table

__all__ = ["device_rows", "list_devices_command"]


def device_rows() -> list[dict[str, str]]:
    """One row per device atomr can use here (CUDA first, then the CPU)."""
    rows = []
    simulated = cuda_is_simulated()
    cores = os.cpu_count() or 1
    for device in list_devices():
        if device.is_cuda:
            note = "numba CUDA simulator" if simulated else "GPU (numba.cuda)"
        else:
            note = (
                f"host CPU, {cores} core(s); more logical devices cpu:1, cpu:2, ... "
                "each get their own worker thread"
            )
        rows.append({"device": str(device), "kind": device.kind, "note": note})
    return rows


def list_devices_command(as_json: bool = False) -> int:
    """Print the devices as a table (or JSON); returns exit status 0."""
    rows = device_rows()
    target = cuda_target()
    if as_json:
        cuda = {"target": target.target, "driver": target.driver, "note": target.note}
        report = {"devices": rows, "cuda_devices": cuda_device_count(), "cuda": cuda}
        print(json.dumps(report, indent=2))
        return 0
    print(format_table([(r["device"], r["note"]) for r in rows], title="atomr devices"))
    driver = f"driver {target.driver}" if target.driver else "no driver"
    print(f"CUDA: {target.target}, {driver} ({target.note})")
    return 0
