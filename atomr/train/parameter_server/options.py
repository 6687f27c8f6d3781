"""`ParameterServerOptions`: the parameter server's own settings (the
settings every trainer shares are in `TrainerConfig`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from atomr._arguments import int_at_least
from atomr.accel import Device
from atomr.train._contract import parse_devices
from atomr.train.parameter_server.consistency import Consistency, check_staleness_bound
from atomr.train.parameter_server.server import ServerShard
from atomr.train.parameter_server.worker import ParameterServerWorker

__all__ = ["ParameterServerOptions"]


def _check_class(name: str, value: object, base: type) -> None:
    if not (isinstance(value, type) and issubclass(value, base)):
        raise TypeError(f"{name} must be a {base.__name__} subclass, got {value!r}")


@dataclass(frozen=True, slots=True)
class ParameterServerOptions:
    """How an `AsyncParameterServer` lays out its server shards and workers.

    Attributes:
        workers: number of workers (None: one per device); they take the
            trainer's devices round-robin.
        shards: number of server shards the weight vector is cut into
            (contiguous ranges, as in MXNet's KVStore / ps-lite).
        server_devices: the shards' devices, used round-robin (None: the
            trainer's devices); kept as a tuple of `Device`.
        consistency: asynchronous (default), bounded(s) or synchronous.
        max_staleness: asynchronous and bounded models: reject pushes staler
            than this (None: no bound); the worker then recomputes.
        max_retries: how many times a batch is sent again to a worker that
            failed (and was restarted) on it.
        worker_class: the worker actor class (`ParameterServerWorker` or a
            subclass: an instrumented or fault-injected one,
            `atomr.testkit.inject_faults`).
        server_class: the server shard actor class (`ServerShard` or a
            subclass: an instrumented or fault-injected one), spawned once
            per range with `ServerShard`'s arguments.

    Counts are checked as everywhere (`_arguments.int_at_least`) and kept as
    ints (`np.int32(2)` is 2).

    Raises:
        TypeError: a count that is no int (2.0, True, "2"), `consistency`
            not a `Consistency`, `worker_class` not
            a `ParameterServerWorker` subclass, `server_class` not a
            `ServerShard` subclass, or `server_devices` not a sequence of
            devices.
        ValueError: a count out of range, an unknown device name, no server
            devices, or `max_staleness` with synchronous consistency (which
            refuses every stale push anyway).
    """

    workers: int | None = None
    shards: int = 1
    server_devices: Sequence[Device | str] | None = None
    consistency: Consistency = Consistency()
    max_staleness: int | None = None
    max_retries: int = 3
    worker_class: type[ParameterServerWorker] = ParameterServerWorker
    server_class: type[ServerShard] = ServerShard

    def __post_init__(self) -> None:
        if self.workers is not None:
            object.__setattr__(self, "workers", int_at_least("workers", self.workers, 1))
        object.__setattr__(self, "shards", int_at_least("shards", self.shards, 1))
        object.__setattr__(self, "max_retries", int_at_least("max_retries", self.max_retries, 0))
        if not isinstance(self.consistency, Consistency):
            raise TypeError(
                "consistency must be a Consistency (Consistency.asynchronous(), .bounded(s) or "
                f".synchronous(), from atomr.train.parameter_server), got {self.consistency!r}"
            )
        object.__setattr__(
            self, "max_staleness", check_staleness_bound(self.max_staleness, "max_staleness")
        )
        if self.max_staleness is not None and self.consistency.is_synchronous:
            raise ValueError(
                "max_staleness does not apply to synchronous consistency, "
                "which refuses every stale push"
            )
        _check_class("worker_class", self.worker_class, ParameterServerWorker)
        _check_class("server_class", self.server_class, ServerShard)
        if self.server_devices is not None:
            object.__setattr__(
                self,
                "server_devices",
                tuple(parse_devices(self.server_devices, name="server_devices")),
            )
