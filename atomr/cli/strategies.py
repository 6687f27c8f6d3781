"""Spawning the trainer of each `--strategy`.

Each strategy's trainer takes its own config type; this module builds it
from the run's options and wraps the result in a `TrainerHandle`, so the
epoch loop (`atomr.cli.training_run`) is written once. A strategy whose
trainer module cannot be imported fails with one line
("strategy X is not available yet").
"""

from __future__ import annotations

import importlib
from typing import Any

from atomr.cli.errors import CliError
from atomr.cli.run_config import RunConfig
from atomr.cli.trainer_handle import ActorTrainerHandle, DistributedTrainerHandle, TrainerHandle
from atomr.train import Mlp, TrainerConfig

__all__ = ["micro_batch_size", "spawn_trainer", "strategy_available"]

_MODULES = {
    "single": ("atomr.train.trainer", "Trainer"),
    "data": ("atomr.train.data_parallel.trainer", "DataParallelTrainer"),
    "tensor": ("atomr.train.tensor_parallel.trainer", "TensorParallelTrainer"),
    "pipeline": ("atomr.train.pipeline.trainer", "PipelineParallelTrainer"),
    "ps": ("atomr.train.parameter_server", "AsyncParameterServer"),
}


def _module(strategy: str) -> Any:
    module_name, class_name = _MODULES[strategy]
    try:
        module = importlib.import_module(module_name)
        getattr(module, class_name)
    except (ImportError, AttributeError):
        raise CliError(f"strategy {strategy} is not available yet", 1) from None
    return module


def strategy_available(strategy: str) -> bool:
    """True when the trainer class of `strategy` can be imported."""
    try:
        _module(strategy)
    except CliError:
        return False
    return True


def micro_batch_size(run: RunConfig) -> int:
    """The pipeline's micro-batch size: `--micro-batch-size`, else a quarter
    of the batch (at least 1), so a full batch makes 4 micro-batches."""
    if run.micro_batch_size is not None:
        return run.micro_batch_size
    return max(1, run.batch_size // 4)


async def _spawn_distributed(
    system: Any, run: RunConfig, model: Mlp, config: TrainerConfig
) -> TrainerHandle:
    try:
        module = importlib.import_module("atomr.train.data_parallel.distributed")
    except ImportError:
        raise CliError("--distributed is not available yet", 1) from None
    try:
        ddp = await module.spawn_distributed_data_parallel(
            system, model, list(run.devices), config, run.dist
        )
    except ImportError:
        raise CliError("--distributed needs mpi4py: pip install -e '.[mpi]'", 1) from None
    return DistributedTrainerHandle(ddp)


async def _spawn(system: Any, run: RunConfig, model: Mlp, config: TrainerConfig) -> TrainerHandle:
    if run.dist is not None:
        return await _spawn_distributed(system, run, model, config)
    module = _module(run.strategy)
    devices = list(run.devices)
    if run.strategy == "single":
        ref = await module.Trainer.spawn(system, model, devices[0], config)
    elif run.strategy == "data":
        ref = await module.DataParallelTrainer.spawn(system, model, devices, config)
    elif run.strategy == "tensor":
        tp_config = module.TensorParallelConfig(
            len(devices), config.optimizer, config.loss, config.gradient_clip
        )
        ref = await module.TensorParallelTrainer.spawn(system, model, devices, tp_config)
    elif run.strategy == "pipeline":
        pp_config = module.PipelineConfig(
            micro_batch_size(run),
            config.gradient_clip,
            optimizer=config.optimizer,
            loss=config.loss,
        )
        ref = await module.PipelineParallelTrainer.spawn(
            system, model, devices, pp_config, schedule=run.schedule
        )
    else:
        options = module.ParameterServerOptions(workers=run.workers)
        ref = await module.AsyncParameterServer.spawn(system, model, devices, config, options)
    return ActorTrainerHandle(run.strategy, ref)


async def spawn_trainer(
    system: Any, run: RunConfig, model: Mlp, config: TrainerConfig
) -> TrainerHandle:
    """Spawn the trainer of `run.strategy` on `run.devices`.

    Args:
        system: the `ActorSystem`.
        run: the run's options (strategy, devices, schedule, workers, ...).
        model: the initial model.
        config: optimizer, loss and clipping.

    Returns:
        The trainer, ready for its first step.

    Raises:
        CliError: the strategy's trainer is not available, or it refused the
            options (for example more pipeline stages than layers).
    """
    try:
        return await _spawn(system, run, model, config)
    except (ValueError, TypeError) as exc:
        raise CliError(f"--strategy {run.strategy}: {exc}") from None
