"""Training: the Mlp with flat parameters, losses, optimizers, checkpoints
and the trainer actors (see docs/training.md)."""

from atomr.train.comm.collective import Collective, HostCollective
from atomr.train.comm.mpi.collective import (
    CollectiveError,
    CollectiveTimeoutError,
    MpiCollective,
    RankFailedError,
)
from atomr.train.comm.mpi.job import DistributedTrainConfig, NotLaunchedError, shard_for_rank
from atomr.train.comm.ring import RingCollective
from atomr.train.core.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from atomr.train.core.clip import clip_grad_norm, global_norm
from atomr.train.core.config import TrainerConfig
from atomr.train.core.data import load_digits_split, synthetic_classification
from atomr.train.core.errors import (
    CheckpointError,
    InvalidBatchError,
    NonFiniteError,
    WorkerStateLost,
)
from atomr.train.core.loss import LossKind
from atomr.train.core.messages import (
    Evaluate,
    GetWeights,
    LoadCheckpoint,
    SaveCheckpoint,
    Step,
)
from atomr.train.core.mlp import LayerOffsets, Mlp, Tape
from atomr.train.core.optimizer import Optimizer, OptimizerKind
from atomr.train.core.stats import EvalResult, StepStats
from atomr.train.core.validation import validate_batch, validate_features
from atomr.train.data_parallel import (
    DataParallelOptions,
    DataParallelTrainer,
    GetReplicaWeights,
    ReplicaActor,
    ReplicaDivergenceError,
    ReplicaState,
    SetReplicas,
    SpeedBalancer,
)
from atomr.train.parameter_server.consistency import Consistency
from atomr.train.parameter_server.messages import (
    ParameterServerStats,
    PullWeights,
    PushGradient,
    StaleGradientError,
    Stats,
)
from atomr.train.parameter_server.trainer import AsyncParameterServer
from atomr.train.pipeline import (
    GetGradients,
    GetTimeline,
    PipelineOptions,
    PipelineParallelTrainer,
    PipelineStageProtocol,
    Schedule,
    StageActor,
    Timeline,
)
from atomr.train.pipeline.schedule import Op, OpKind
from atomr.train.pipeline.timeline import BusyInterval
from atomr.train.tensor_parallel import (
    ShardActor,
    ShardProtocol,
    TensorParallelOptions,
    TensorParallelTrainer,
)
from atomr.train.trainer import Trainer

__all__ = [
    "CollectiveError",
    "CollectiveTimeoutError",
    "DistributedTrainConfig",
    "MpiCollective",
    "NotLaunchedError",
    "RankFailedError",
    "shard_for_rank",
    "AsyncParameterServer",
    "Consistency",
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
    "PipelineOptions",
    "PipelineParallelTrainer",
    "PipelineStageProtocol",
    "Schedule",
    "StageActor",
    "Timeline",
    "Collective",
    "DataParallelOptions",
    "DataParallelTrainer",
    "HostCollective",
    "ReplicaActor",
    "ReplicaDivergenceError",
    "ReplicaState",
    "RingCollective",
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
    "ShardProtocol",
    "TensorParallelOptions",
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
]
