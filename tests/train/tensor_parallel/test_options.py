"""TensorParallelOptions: the tensor-parallel trainer's own settings, checked
when built."""

from __future__ import annotations

import pytest

from atomr import ActorSystem, Props
from atomr.accel import cpu_devices
from atomr.train import LossKind, Mlp, OptimizerKind, TensorParallelTrainer, Trainer, TrainerConfig
from atomr.train.core.model import gpt
from atomr.train.tensor_parallel import ShardActor, TensorParallelOptions
from atomr.train.tensor_parallel.layer_shard import LayerShardActor


def test_the_default_shard_is_the_built_in_one() -> None:
    assert TensorParallelOptions().shard_class is ShardActor


@pytest.mark.parametrize("shard_class", [Trainer, object, "ShardActor"])
def test_a_shard_class_must_be_a_shard_actor(shard_class: object) -> None:
    with pytest.raises(TypeError, match="shard_class must be a ShardActor subclass"):
        TensorParallelOptions(shard_class=shard_class)  # type: ignore[arg-type]


class _MyShard(ShardActor):
    pass


class _MyLayerShard(LayerShardActor):
    pass


@pytest.mark.parametrize(
    ("model", "options", "refused"),
    [
        ("gpt", TensorParallelOptions(shard_class=_MyShard), "shard_class"),
        ("mlp", TensorParallelOptions(layer_shard_class=_MyLayerShard), "layer_shard_class"),
    ],
)
async def test_a_shard_class_of_the_other_model_path_is_refused_at_spawn(
    actor_system: ActorSystem, model: str, options: TensorParallelOptions, refused: str
) -> None:
    built = gpt(9, 6, n_layer=1, d_model=8, n_head=2, seed=3) if model == "gpt" else Mlp([4, 8, 3])
    config = TrainerConfig(OptimizerKind.sgd(0.1), LossKind.CROSS_ENTROPY)
    with pytest.raises(ValueError, match=f"{refused} .*does not apply") as refusal:
        await TensorParallelTrainer.spawn(actor_system, built, cpu_devices(2), config, options)
    assert type(built).__name__ in str(refusal.value)
    assert actor_system.actors == []  # nothing spawned


def test_props_refuses_a_layer_shard_class() -> None:
    config = TrainerConfig(OptimizerKind.sgd(0.1), LossKind.CROSS_ENTROPY)
    with pytest.raises(ValueError, match="layer_shard_class"):
        TensorParallelTrainer.props(
            config, [Props(ShardActor)], TensorParallelOptions(layer_shard_class=_MyLayerShard)
        )
