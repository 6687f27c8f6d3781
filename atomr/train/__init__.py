"""Training: one contract, six strategies, one fit loop (see docs/training.md).

Every trainer is an actor: `ref = await X.spawn(system, model, devices,
config, options=None)` and it answers `Step`, `Evaluate`, `GetWeights`,
`SaveCheckpoint` and `LoadCheckpoint`. Swapping strategies changes one line:

| strategy | trainer | its options |
|---|---|---|
| one device | `Trainer` | none |
| data parallel | `DataParallelTrainer` | `DataParallelOptions` |
| tensor parallel | `TensorParallelTrainer` | `TensorParallelOptions` |
| pipeline parallel | `PipelineParallelTrainer` | `PipelineOptions` |
| parameter server | `AsyncParameterServer` | `ParameterServerOptions` |
| sharded data parallel (ZeRO 1-3) | `ShardedDataParallelTrainer` | `ShardedOptions` |

`fit(ref, (x, y), epochs=..., batch_size=...)` trains any of them. Everything
else lives in the packages: `atomr.train.core` (model, losses, optimizers,
checkpoints, validation), `atomr.train.comm` (collectives; `.mpi` across
processes), and one package per strategy.
"""

from atomr.train.core.checkpoint import load_checkpoint
from atomr.train.core.config import TrainerConfig
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
    SetLearningRate,
    Step,
)
from atomr.train.core.mlp import Mlp
from atomr.train.core.optimizer import OptimizerKind
from atomr.train.core.stats import EvalResult, StepStats
from atomr.train.data_parallel import DataParallelOptions, DataParallelTrainer
from atomr.train.fit import FitCallback, fit
from atomr.train.parameter_server import AsyncParameterServer, ParameterServerOptions
from atomr.train.pipeline import PipelineOptions, PipelineParallelTrainer
from atomr.train.setup import setup
from atomr.train.sharded import ShardedDataParallelTrainer, ShardedOptions
from atomr.train.tensor_parallel import TensorParallelOptions, TensorParallelTrainer
from atomr.train.trainer import Trainer

__all__ = [
    "AsyncParameterServer",
    "CheckpointError",
    "DataParallelOptions",
    "DataParallelTrainer",
    "EvalResult",
    "Evaluate",
    "FitCallback",
    "GetWeights",
    "InvalidBatchError",
    "LoadCheckpoint",
    "LossKind",
    "Mlp",
    "NonFiniteError",
    "OptimizerKind",
    "ParameterServerOptions",
    "PipelineOptions",
    "PipelineParallelTrainer",
    "SaveCheckpoint",
    "SetLearningRate",
    "ShardedDataParallelTrainer",
    "ShardedOptions",
    "Step",
    "StepStats",
    "TensorParallelOptions",
    "TensorParallelTrainer",
    "Trainer",
    "TrainerConfig",
    "WorkerStateLost",
    "fit",
    "load_checkpoint",
    "setup",
]
