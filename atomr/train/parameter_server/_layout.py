"""`Layout`: where the server shards and workers of one `AsyncParameterServer`
run, and which range of the weight vector each shard holds; built (and
every argument checked) once, when the trainer's `Props` are made."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from atomr._arguments import array_bytes
from atomr.accel import Device
from atomr.actor import ActorRef, Props
from atomr.train._contract import (
    check_config,
    check_model,
    check_options,
    parse_devices,
    refuse_accumulation,
)
from atomr.train.core.config import TrainerConfig
from atomr.train.core.model.sequential import Sequential
from atomr.train.parameter_server._client import split_ranges
from atomr.train.parameter_server._last_result import LastResult
from atomr.train.parameter_server.options import ParameterServerOptions

__all__ = ["Layout"]


@dataclass(frozen=True)
class Layout:
    """A checked parameter-server deployment.

    Attributes:
        model: the model (its weights are the initial weights).
        config: optimizer, loss, clipping, `worker_timeout`.
        options: the parameter server's options.
        worker_devices: one device per worker.
        server_devices: one device per server shard.
        ranges: `(start, stop)` of each shard's range.
    """

    model: Sequential
    config: TrainerConfig
    options: ParameterServerOptions
    worker_devices: tuple[Device, ...]
    server_devices: tuple[Device, ...]
    ranges: tuple[tuple[int, int], ...]

    @classmethod
    def plan(
        cls,
        model: Any,
        devices: Any,
        config: Any,
        options: Any = None,
    ) -> Layout:
        """Check the trainer's arguments and place every actor.

        Args:
            model: the model (any `Sequential`).
            devices: the workers' devices (a sequence), used round-robin.
            config: a `TrainerConfig`.
            options: a `ParameterServerOptions`, or None for the defaults.

        Returns:
            The layout.

        Raises:
            TypeError: an argument of the wrong type, named in the message
                (the checks every trainer shares: `check_model`,
                `check_config`, `check_options`).
            ValueError: no devices or a bad device name, more shards than
                weights, more workers than their model replicas' bytes let
                an array hold (`array_bytes`), `accumulation_steps > 1` (the parameter server does
                not accumulate: `refuse_accumulation`), gradient clipping
                with several shards (it needs the global norm), or an optimizer
                hyperparameter or class weight out of range in the model's dtype
                (`TrainerConfig.check_dtype`).
        """
        model = check_model(model)
        devs = tuple(parse_devices(devices))
        config = check_config(config)
        options = check_options(options, ParameterServerOptions, "AsyncParameterServer")
        refuse_accumulation(config, "parameter-server")
        if options.shards > 1 and config.gradient_clip is not None:
            raise ValueError("gradient clipping needs the global norm: use shards=1")
        config.check_dtype(model.dtype)
        workers = len(devs) if options.workers is None else options.workers
        ranges = tuple(split_ranges(model.n_params, options.shards))  # before a device per shard
        what = f"the model replicas of {workers} workers"  # before a device per worker
        array_bytes(what, workers * model.n_params, model.dtype.itemsize)
        # `ParameterServerOptions` parsed its server devices when it was built
        server_devs = cast("tuple[Device, ...]", options.server_devices or devs)
        return cls(
            model,
            config,
            options,
            tuple(devs[i % len(devs)] for i in range(workers)),
            tuple(server_devs[k % len(server_devs)] for k in range(options.shards)),
            ranges,
        )

    def server_props(self) -> list[Props]:
        """The `Props` of every server shard, in range order."""
        weights = self.model.get_params()
        consistency = self.options.consistency
        return [
            self.options.server_class.props(
                weights[lo:hi],
                self.config.optimizer,
                self.options.max_staleness,
                consistency=consistency,
                workers=len(self.worker_devices),
                device=device,
                gradient_clip=self.config.gradient_clip,
                dtype=self.model.dtype,
            )
            for (lo, hi), device in zip(self.ranges, self.server_devices, strict=True)
        ]

    def worker_props(self, servers: list[ActorRef]) -> list[Props]:
        """The `Props` of every worker, pulling from and pushing to `servers`;
        each holds the worker's `LastResult`, so that it outlives a restart."""
        synchronous = self.options.consistency.is_synchronous
        return [
            self.options.worker_class.props(
                i,
                self.model,
                device,
                self.config,
                servers,
                self.ranges,
                synchronous,
                last_result=LastResult(),
            )
            for i, device in enumerate(self.worker_devices)
        ]
