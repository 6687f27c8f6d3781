"""Tensor parallel: each layer split across shards, Megatron-LM's column/row
pairing (see docs/tensor_parallel.md).

- `TensorParallelTrainer` (trainer.py) and its `TensorParallelOptions`
  (options.py);
- `ShardProtocol` and its messages (messages.py): what a shard answers;
- `ShardActor` (shard.py): the built-in shard;
- `LayerShardProtocol` and its messages (layer_messages.py): what a shard
  of any `Sequential` (the layer-sharded path) answers;
- `LayerShardActor` (layer_shard.py): its built-in shard;
- `ShardGroup` (group.py): the fan-out of a step's phases over the shards;
- sharding.py: which slice of each layer a shard owns.
"""

from atomr.train.tensor_parallel.layer_messages import LayerShardProtocol
from atomr.train.tensor_parallel.layer_shard import LayerShardActor
from atomr.train.tensor_parallel.messages import ShardProtocol
from atomr.train.tensor_parallel.options import TensorParallelOptions
from atomr.train.tensor_parallel.shard import ShardActor
from atomr.train.tensor_parallel.trainer import TensorParallelTrainer

__all__ = [
    "LayerShardActor",
    "LayerShardProtocol",
    "ShardActor",
    "ShardProtocol",
    "TensorParallelOptions",
    "TensorParallelTrainer",
]
