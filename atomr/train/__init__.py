"""Training: the Mlp with flat parameters, losses, optimizers, checkpoints
and the trainer actors (see docs/training.md)."""

from atomr.train.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from atomr.train.clip import clip_grad_norm, global_norm
from atomr.train.config import TrainerConfig
from atomr.train.data import load_digits_split, synthetic_classification
from atomr.train.errors import CheckpointError, InvalidBatchError, NonFiniteError
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
from atomr.train.optimizer import Optimizer, OptimizerKind
from atomr.train.stats import EvalResult, StepStats
from atomr.train.trainer import Trainer
from atomr.train.validation import validate_batch, validate_features, validate_targets

__all__ = [
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
    "Optimizer",
    "OptimizerKind",
    "SaveCheckpoint",
    "SetReplicas",
    "Step",
    "StepStats",
    "Tape",
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
