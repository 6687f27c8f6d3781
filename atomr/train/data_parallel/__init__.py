"""Data parallel: one model replicated on N devices, gradients all-reduced
(see docs/data_parallel.md).

- `DataParallelTrainer` (`trainer.py`): the trainer actor.
- `DataParallelOptions` (`options.py`): its own settings.
- `ReplicaProtocol` and the messages (`messages.py`): what a replica answers.
- `ReplicaActor` (`replica.py`): the built-in replica.
- `SpeedBalancer` (`speed_balancer.py`): how a batch is split.
- private: the step's phases (`_step.py`), the reduction between them
  (`_reduction.py`), keeping the replicas identical (`_replicas.py`),
  checkpoints (`_checkpoints.py`), the verbs of a hand-written loop
  (`_manual.py`: `SyncParams`, `ComputeReplicaGradients`,
  `AllReduceGradients`, `WeightedAllReduceGradients`, `ApplyGradients`,
  `GetWorldSize`, `GetDevices`).
"""

from atomr.train.data_parallel._replicas import ReplicaDivergenceError
from atomr.train.data_parallel.messages import (
    AllReduceGradients,
    ApplyGradients,
    ComputeReplicaGradients,
    GetDevices,
    GetReplicaWeights,
    GetWorldSize,
    ReplicaProtocol,
    ReplicaState,
    SetReplicas,
    SyncParams,
    WeightedAllReduceGradients,
)
from atomr.train.data_parallel.options import ApplyPolicy, DataParallelOptions
from atomr.train.data_parallel.replica import ReplicaActor
from atomr.train.data_parallel.speed_balancer import SpeedBalancer
from atomr.train.data_parallel.trainer import DataParallelTrainer

__all__ = [
    "AllReduceGradients",
    "ApplyPolicy",
    "ApplyGradients",
    "ComputeReplicaGradients",
    "GetDevices",
    "GetWorldSize",
    "SyncParams",
    "WeightedAllReduceGradients",
    "DataParallelOptions",
    "DataParallelTrainer",
    "GetReplicaWeights",
    "ReplicaActor",
    "ReplicaDivergenceError",
    "ReplicaProtocol",
    "ReplicaState",
    "SetReplicas",
    "SpeedBalancer",
]
