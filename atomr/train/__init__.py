"""Training: the Mlp with flat parameters, losses, optimizers, checkpoints
and the trainer actors (see docs/training.md)."""

from atomr.train.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from atomr.train.clip import clip_grad_norm, global_norm
from atomr.train.collective import Collective, HostCollective
from atomr.train.config import TrainerConfig
from atomr.train.data import load_digits_split, synthetic_classification
from atomr.train.data_parallel import (
    DataParallelConfig,
    DataParallelTrainer,
    ReplicaDivergenceError,
)
from atomr.train.distributed import DistributedTrainConfig, NotLaunchedError, shard_for_rank
from atomr.train.distributed_trainer import (
    DistributedDataParallel,
    spawn_distributed_data_parallel,
)
from atomr.train.errors import (
    CheckpointError,
    InvalidBatchError,
    NonFiniteError,
    WorkerStateLost,
)
from atomr.train.loss import LossKind
from atomr.train.messages import (
    Evaluate,
    GetReplicaWeights,
    GetWeights,
    LoadCheckpoint,
    SaveCheckpoint,
    SetReplicas,
    Step,
)
from atomr.train.mlp import LayerOffsets, Mlp, Tape
from atomr.train.mpi_collective import (
    CollectiveError,
    CollectiveTimeoutError,
    MpiCollective,
    RankFailedError,
)
from atomr.train.optimizer import Optimizer, OptimizerKind
from atomr.train.parameter_server import AsyncParameterServer
from atomr.train.pipeline_parallel import GetGradients, PipelineConfig, PipelineParallelTrainer
from atomr.train.ps_consistency import Consistency
from atomr.train.ps_handle import EpochRecord, ParameterServerHandle
from atomr.train.ps_messages import (
    ParameterServerStats,
    PullWeights,
    PushGradient,
    StaleGradientError,
    Stats,
)
from atomr.train.replica import ReplicaActor, ReplicaState
from atomr.train.ring_all_reduce import RingAllReduce
from atomr.train.schedule import Op, OpKind, Schedule
from atomr.train.shard import ShardActor, ShardProtocol
from atomr.train.speed_balancer import SpeedBalancer
from atomr.train.stage import PipelineStageProtocol, StageActor
from atomr.train.stats import EvalResult, StepStats
from atomr.train.tensor_parallel import (
    ShardGroup,
    TensorParallelConfig,
    TensorParallelTrainer,
)
from atomr.train.timeline import BusyInterval, GetTimeline, Timeline
from atomr.train.trainer import Trainer
from atomr.train.validation import validate_batch, validate_features, validate_targets

__all__ = [
    "CollectiveError",
    "CollectiveTimeoutError",
    "DistributedDataParallel",
    "DistributedTrainConfig",
    "MpiCollective",
    "NotLaunchedError",
    "RankFailedError",
    "shard_for_rank",
    "spawn_distributed_data_parallel",
    "AsyncParameterServer",
    "Consistency",
    "EpochRecord",
    "ParameterServerHandle",
    "ParameterServerStats",
    "PullWeights",
    "PushGradient",
    "StaleGradientError",
    "Stats",
    "BusyInterval",
    "GetGradients",
    "GetTimeline",
    "Op",
    "OpKind",
    "PipelineConfig",
    "PipelineParallelTrainer",
    "PipelineStageProtocol",
    "Schedule",
    "StageActor",
    "Timeline",
    "Collective",
    "DataParallelConfig",
    "DataParallelTrainer",
    "HostCollective",
    "ReplicaActor",
    "ReplicaDivergenceError",
    "ReplicaState",
    "RingAllReduce",
    "SpeedBalancer",
    "Checkpoint",
    "CheckpointError",
    "EvalResult",
    "Evaluate",
    "GetReplicaWeights",
    "GetWeights",
    "InvalidBatchError",
    "LayerOffsets",
    "LoadCheckpoint",
    "LossKind",
    "Mlp",
    "NonFiniteError",
    "WorkerStateLost",
    "Optimizer",
    "OptimizerKind",
    "SaveCheckpoint",
    "SetReplicas",
    "Step",
    "StepStats",
    "Tape",
    "ShardActor",
    "ShardGroup",
    "ShardProtocol",
    "TensorParallelConfig",
    "TensorParallelTrainer",
    "Trainer",
    "TrainerConfig",
    "clip_grad_norm",
    "global_norm",
    "load_checkpoint",
    "load_digits_split",
    "save_checkpoint",
    "synthetic_classification",
    "validate_batch",
    "validate_features",
    "validate_targets",
]
