"""`TensorParallelOptions`: the settings only the tensor-parallel trainer has."""

from __future__ import annotations

from dataclasses import dataclass

from atomr.train.core.mlp import Mlp
from atomr.train.tensor_parallel.layer_shard import LayerShardActor
from atomr.train.tensor_parallel.shard import ShardActor

__all__ = ["TensorParallelOptions"]


@dataclass(frozen=True, slots=True)
class TensorParallelOptions:
    """What `TensorParallelTrainer` needs besides its `TrainerConfig`.

    The shard count is not an option: it is the number of devices given to
    `spawn` (or of shards given to `props`). Optimizer, loss, clipping and
    the workers' reply deadline come from the `TrainerConfig`.

    Attributes:
        shard_class: the shard actor `spawn` starts on each device:
            `ShardActor` or a subclass of it (an instrumented shard, say).
            `props` takes shards that are already built, so there it must
            stay `ShardActor`.
        layer_shard_class: the shard actor `spawn` starts for any model other
            than an `Mlp` (split by its layers' rules): `LayerShardActor` or a
            subclass (a fault-injected one: `atomr.testkit.inject_faults`).

    Each shard class applies to its own kind of model only: `spawn` refuses
    one set for the other kind (`check_model`).

    Raises:
        TypeError: a shard class that is not the right actor or a subclass of it.
    """

    shard_class: type[ShardActor] = ShardActor
    layer_shard_class: type[LayerShardActor] = LayerShardActor

    def __post_init__(self) -> None:
        cls = self.shard_class
        if not (isinstance(cls, type) and issubclass(cls, ShardActor)):
            raise TypeError(f"shard_class must be a ShardActor subclass, got {cls!r}")
        layer = self.layer_shard_class
        if not (isinstance(layer, type) and issubclass(layer, LayerShardActor)):
            raise TypeError(f"layer_shard_class must be a LayerShardActor subclass, got {layer!r}")

    def check_model(self, model: object) -> None:
        """Refuse the shard class of the path `model` does not take.

        Args:
            model: the model to split (an `Mlp` takes `shard_class`, any
                other model `layer_shard_class`).

        Raises:
            ValueError: `shard_class` set for a model other than an `Mlp`, or
                `layer_shard_class` set for an `Mlp`.
        """
        is_mlp = isinstance(model, Mlp)
        name, default, applies = (
            ("layer_shard_class", LayerShardActor, "models other than an Mlp")
            if is_mlp
            else ("shard_class", ShardActor, "an Mlp")
        )
        if getattr(self, name) is not default:
            raise ValueError(
                f"{name} does not apply to a {type(model).__name__}: it is the shard of "
                f"{applies} (leave it {default.__name__})"
            )
