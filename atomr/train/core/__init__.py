"""The training core: the model, losses, optimizers, clipping, checkpoints,
data, validation and the messages every trainer answers. No actors live here.

- `Mlp` (`mlp.py`): the model, one flat float32 parameter vector.
- `LossKind` (`loss.py`), `OptimizerKind` (`optimizer.py`) and the state it
  creates, `Optimizer` (`optimizer_state.py`),
  `clip_grad_norm` / `global_norm` (`clip.py`).
- `TrainerConfig` (`config.py`): what every strategy shares.
- The contract's messages (`messages.py`) and replies (`stats.py`).
- Checkpoints (`checkpoint.py`; an accumulation window saved in one:
  `accumulation.py`; what every `LoadCheckpoint` reads, a sharded save's
  files merged: `sharded_index.py`), data sets (`data.py`), errors (`errors.py`: every one a caller catches
  is exported here, `StepLimitError` included; `atomr.train` re-exports the
  commonest).
- One home per rule: `validation.py` (a batch), `_step_checks.py` (a step's
  loss, normaliser and gradient), `partition.py` (splitting n items into k
  parts), `device_guard.py` (which errors reject a request).
"""

from atomr.train.core.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from atomr.train.core.clip import clip_grad_norm, global_norm
from atomr.train.core.config import TrainerConfig
from atomr.train.core.data import load_digits_split, synthetic_classification
from atomr.train.core.errors import (
    CheckpointError,
    InvalidBatchError,
    NonFiniteError,
    OtherProcessFailed,
    StepLimitError,
    WorkerStateLost,
)
from atomr.train.core.loss import LossKind
from atomr.train.core.messages import (
    CloseRound,
    Evaluate,
    GetTrainingState,
    GetWeights,
    LoadCheckpoint,
    SaveCheckpoint,
    SetLearningRate,
    Step,
)
from atomr.train.core.mlp import LayerOffsets, Mlp
from atomr.train.core.optimizer import OptimizerKind
from atomr.train.core.optimizer_state import Optimizer
from atomr.train.core.partition import split_bounds, split_sizes
from atomr.train.core.stats import EvalResult, StepStats, TrainingState
from atomr.train.core.validation import validate_batch, validate_features

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "CloseRound",
    "EvalResult",
    "Evaluate",
    "GetTrainingState",
    "GetWeights",
    "InvalidBatchError",
    "LayerOffsets",
    "LoadCheckpoint",
    "LossKind",
    "Mlp",
    "NonFiniteError",
    "OtherProcessFailed",
    "Optimizer",
    "OptimizerKind",
    "SaveCheckpoint",
    "SetLearningRate",
    "Step",
    "StepLimitError",
    "StepStats",
    "TrainerConfig",
    "TrainingState",
    "WorkerStateLost",
    "clip_grad_norm",
    "global_norm",
    "load_checkpoint",
    "load_digits_split",
    "save_checkpoint",
    "split_bounds",
    "split_sizes",
    "synthetic_classification",
    "validate_batch",
    "validate_features",
]
