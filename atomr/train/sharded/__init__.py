"""Sharded data parallel (ZeRO stages 1-3): `ShardedDataParallelTrainer`,
its options, replica and messages, and sharded checkpoints (docs/sharded.md)."""

from atomr.train.sharded.checkpoints import merge_shards
from atomr.train.sharded.layout import ShardLayout
from atomr.train.sharded.messages import GetShardMemory, ShardedReplicaProtocol, ShardMemory
from atomr.train.sharded.options import ShardedOptions
from atomr.train.sharded.replica import ShardedReplica
from atomr.train.sharded.trainer import ShardedDataParallelTrainer

__all__ = [
    "GetShardMemory",
    "ShardLayout",
    "ShardMemory",
    "ShardedDataParallelTrainer",
    "ShardedOptions",
    "ShardedReplica",
    "ShardedReplicaProtocol",
    "merge_shards",
]
