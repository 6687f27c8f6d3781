"""`atomr train --devices`: the devices a run trains on, parsed and checked
against the machine and the strategy."""

from __future__ import annotations

from atomr.accel import Device, cuda_device_count, cuda_is_simulated, training_devices
from atomr.cli.errors import CliError
from atomr.cli.strategies import STRATEGIES
from atomr.train.comm.mpi.job import DistributedTrainConfig

__all__ = ["MAX_CPU_DEVICES", "parse_devices", "resolve_devices"]

MAX_CPU_DEVICES = 1024
"""The most logical CPU devices `--devices N` makes: each is a worker thread
of this process with its own copy of the model, so thousands only slow the
run on a machine's few cores; a count beyond it was made device by device,
before any other check (`--devices 1000000000000` never started)."""


def _real_cuda_count() -> int:
    return 0 if cuda_is_simulated() else cuda_device_count()


def parse_devices(
    spec: str | None, strategy: str, dist: DistributedTrainConfig | None = None
) -> tuple[Device, ...]:
    """Parse `--devices`.

    Args:
        spec: None (the default for `strategy`), "N" (the first N devices:
            CUDA when the machine has GPUs, else N logical CPU devices), or a
            comma list of names ("cpu:0,cpu:1", "cuda:0,cuda:1").
        strategy: the training strategy; one that trains on one device
            (`Strategy.one_device`) defaults to one.
        dist: this process's place in a distributed job, or None. By default
            a rank takes one device: the GPU `local_rank` when the machine has
            one per local rank, else one logical CPU device.

    Returns:
        The devices, distinct, in the given order.

    Raises:
        CliError: a malformed spec, a repeated device, a CUDA device this
            machine does not have, or more than `MAX_CPU_DEVICES` logical
            CPU devices.
    """
    gpus = _real_cuda_count()
    if spec is None and dist is not None:
        if gpus >= dist.local_world_size:
            return (Device("cuda", dist.local_rank),)
        return (Device("cpu", 0),)
    if spec is None:
        found = training_devices()
        return found[:1] if STRATEGIES[strategy].one_device else found
    text = spec.strip()
    if text.isdecimal():  # "²" is a digit, but no number int() reads
        return _first_devices(text, gpus)
    devices: list[Device] = []
    for name in text.split(","):
        try:
            device = Device.parse(name)
        except (ValueError, TypeError) as exc:
            raise CliError(f"--devices: {exc}") from None
        if device in devices:
            raise CliError(f"--devices names {device} twice")
        if device.is_cuda:
            available = cuda_device_count()
            if device.index >= available:
                raise CliError(
                    f"--devices: no such device {device} (this machine has {available} "
                    "CUDA device(s); see 'atomr devices')"
                )
        devices.append(device)
    return tuple(devices)


def _first_devices(text: str, gpus: int) -> tuple[Device, ...]:
    """`--devices N` (`text`, decimal digits): the first N of the machine's
    `gpus` GPUs, or without any, N logical CPU devices.

    Raises:
        CliError: N below 1, or more than the machine's GPUs or, without
            any, `MAX_CPU_DEVICES`, checked before any device is made.
    """
    limit = gpus or MAX_CPU_DEVICES
    digits = text.lstrip("0") or "0"  # int() reads at most 4300 digits: no need to
    count = int(digits) if len(digits) <= len(str(limit)) else limit + 1
    shown = text if len(text) <= 24 else f"{text[:12]}... ({len(text)} digits)"
    if count < 1:
        raise CliError(f"--devices needs N >= 1, got {shown!r}")
    if count > limit and not gpus:
        raise CliError(
            f"--devices {shown}: at most {MAX_CPU_DEVICES} logical CPU devices (each is a "
            "worker thread with its own copy of the model)"
        )
    if count > limit:
        raise CliError(
            f"--devices {shown}: this machine has {gpus} GPU(s); use --devices {gpus} or "
            "fewer, or a list of CPU devices such as cpu:0,cpu:1 (see 'atomr devices')"
        )
    return tuple(Device("cuda" if gpus else "cpu", i) for i in range(count))


def resolve_devices(
    spec: str | None, strategy: str, dist: DistributedTrainConfig | None
) -> tuple[Device, ...]:
    """The run's devices (`parse_devices`), one for `--strategy single`.

    Raises:
        CliError: a bad `--devices` (see `parse_devices`), or other than one
            device for a strategy that trains on one (`Strategy.one_device`).
    """
    devices = parse_devices(spec, strategy, dist)
    if STRATEGIES[strategy].one_device and len(devices) != 1:
        raise CliError(
            f"--strategy {strategy} trains on one device, got {len(devices)} "
            f"({', '.join(map(str, devices))})"
        )
    return devices
