"""Tensor parallel: each layer split across shards, Megatron-LM's column/row
pairing (see docs/tensor_parallel.md).

- `TensorParallelTrainer` (trainer.py) and its `TensorParallelOptions`
  (options.py);
- `ShardProtocol` and its messages (messages.py): what a shard answers;
- `ShardActor` (shard.py): the built-in shard;
- `ShardGroup` (group.py): the fan-out of a step's phases over the shards;
- sharding.py: which slice of each layer a shard owns.
"""

from atomr.train.tensor_parallel.messages import ShardProtocol
from atomr.train.tensor_parallel.options import TensorParallelOptions
from atomr.train.tensor_parallel.shard import ShardActor
from atomr.train.tensor_parallel.trainer import TensorParallelTrainer

__all__ = [
    "ShardActor",
    "ShardProtocol",
    "TensorParallelOptions",
    "TensorParallelTrainer",
]
