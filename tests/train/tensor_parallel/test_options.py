"""TensorParallelOptions: the tensor-parallel trainer's own settings, checked
when built."""

from __future__ import annotations

import pytest

from atomr.train import Trainer
from atomr.train.tensor_parallel import ShardActor, TensorParallelOptions


def test_the_default_shard_is_the_built_in_one() -> None:
    assert TensorParallelOptions().shard_class is ShardActor


@pytest.mark.parametrize("shard_class", [Trainer, object, "ShardActor"])
def test_a_shard_class_must_be_a_shard_actor(shard_class: object) -> None:
    with pytest.raises(TypeError, match="shard_class must be a ShardActor subclass"):
        TensorParallelOptions(shard_class=shard_class)  # type: ignore[arg-type]
