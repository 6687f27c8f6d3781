"""``slow_device``: make one logical CPU device slower, for tests and
benchmarks.

Heterogeneous devices (a slow GPU beside a fast one) are what the
data-parallel cadence policy is for; on a machine of identical cores they are
made by slowing one device: after each job it runs, the worker thread sleeps
``(factor - 1)`` times the job's own time, so the device takes ``factor``
times as long in wall time (and the sleep leaves the core to the others).
The slowing lives in a subclass of the device actor, which goes where the
actor class would (``DataParallelOptions(replica_class=...)``, ``Props``), so
production device actors carry nothing of it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

from atomr._arguments import real_number

if TYPE_CHECKING:
    from atomr.accel import Device, DeviceActor

__all__ = ["slow_device"]

A = TypeVar("A", bound="type[DeviceActor]")
T = TypeVar("T")


def _slowed(
    factor: float, fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> T:
    """``fn(*args, **kwargs)``, then a sleep of ``(factor - 1)`` times its time."""
    started = time.perf_counter()
    try:
        return fn(*args, **kwargs)
    finally:
        time.sleep((factor - 1.0) * (time.perf_counter() - started))


def slow_device(actor_class: A, device: Device | str, factor: float) -> A:
    """A subclass of ``actor_class`` whose jobs take ``factor`` times as long
    on an actor of ``device`` (actors of other devices run as usual).

    ``DataParallelOptions(replica_class=slow_device(ReplicaActor, "cpu:1", 3))``.

    Args:
        actor_class: a ``DeviceActor`` class (``ReplicaActor``, a user's own).
        device: the logical CPU device to slow.
        factor: how many times as long each job takes (>= 1).

    Raises:
        TypeError: ``actor_class`` is not a ``DeviceActor`` subclass, or
            ``factor`` is not a real number (NumPy's are; a bool is not).
        ValueError: a CUDA device (its time is the GPU's), an unparseable
            device, or a factor below 1 or not finite.
    """
    # imported here, not with the testkit: pytest loads the testkit's plugin in
    # every run, which must not import numba (the device layer) for it
    from atomr.accel import Device, DeviceActor

    if not (isinstance(actor_class, type) and issubclass(actor_class, DeviceActor)):
        raise TypeError(f"actor_class must be a DeviceActor subclass, got {actor_class!r}")
    slow = Device.parse(device)
    if slow.is_cuda:
        raise ValueError("slow_device applies to logical CPU devices only")
    rate = real_number("factor", factor)
    if not (math.isfinite(rate) and rate >= 1.0):
        raise ValueError(f"factor must be finite and >= 1, got {factor!r}")

    async def on_device(self: DeviceActor, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if self.device != slow:
            return await actor_class.on_device(self, fn, *args, **kwargs)
        return await actor_class.on_device(self, _slowed, rate, fn, args, kwargs)

    doc = f"{actor_class.__name__}, its jobs on {slow} {rate}x as long (`slow_device`)."
    namespace = {"on_device": on_device, "__doc__": doc}
    slowed: Any = type(f"Slow{actor_class.__name__}", (actor_class,), namespace)
    return cast(A, slowed)
