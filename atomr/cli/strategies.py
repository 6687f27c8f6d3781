"""The registry of `--strategy` values: one `Strategy` entry each.

Every trainer speaks one contract (`X.spawn(system, model, devices, config,
options)` returns an `ActorRef` answering `Step`, `Evaluate`, ...), so an entry
only says which class trains, which of the command's flags are its own, how
to build its options from them (alone, or as one rank of an MPI job), the
smallest batch it can split and the model copies it keeps. Adding a strategy
to `atomr train` is one entry here; a flag of its own is also declared in
`parser.py` and carried by `RunConfig` (see docs/internals.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from atomr._arguments import int_at_least
from atomr.actor import ActorRef
from atomr.cli.errors import CliError
from atomr.train import (
    AsyncParameterServer,
    DataParallelTrainer,
    PipelineParallelTrainer,
    ShardedDataParallelTrainer,
    ShardedOptions,
    TensorParallelTrainer,
    Trainer,
    TrainerConfig,
)
from atomr.train.core import Checkpoint
from atomr.train.core.model import Sequential
from atomr.train.data_parallel import ApplyPolicy, DataParallelOptions
from atomr.train.parameter_server import ParameterServerOptions
from atomr.train.pipeline import PipelineOptions, Schedule

if TYPE_CHECKING:  # each imports this registry (the options check their flags against it)
    from atomr.cli.job import Job
    from atomr.cli.run_config import RunConfig
    from atomr.train.comm.mpi.job import DistributedTrainConfig

JobOptions = Callable[["RunConfig", "DistributedTrainConfig", Any], tuple[Any, Any]]
"""Builds `(trainer class, options)` for one rank of an MPI job, given the
job's process collective."""

__all__ = [
    "STRATEGIES",
    "Strategy",
    "min_batch_size",
    "saved_steps_per_batch",
    "spawn_trainer",
]


@dataclass(frozen=True)
class Strategy:
    """One `--strategy` value.

    Attributes:
        name: the value of `--strategy`.
        help: one line for `--help`.
        trainer: the trainer class (its `spawn` follows the contract).
        flags: the `atomr train` flags only this strategy takes (a flag of
            another strategy is refused: `RunConfig.from_args`).
        needs: flag -> (other flag, value): one of `flags` that only applies
            when the other flag is given with that value (`--average-every`
            needs `--policy async`).
        options: builds the trainer's options object from the run (None:
            the trainer's defaults).
        min_batch: the smallest batch that gives every worker a sample.
        replicas: the full copies of the model it keeps, for the memory
            estimate (tensor and pipeline split one; the parameter server
            keeps one per worker and its own).
        one_device: it trains on exactly one device (the default `--devices`).
        job: builds `(trainer class, options)` for one rank of an MPI job
            (`--distributed`); None: it cannot run across ranks.
        steps_per_batch: the optimizer steps a checkpoint of it counts per
            batch trained (given the run and the checkpoint; None: the run
            being started), or None where that varies (`--resume` then needs
            the checkpoint's history file to know where the data stands, and
            `--lr-schedule` cannot be sized).
    """

    name: str
    help: str
    trainer: Any
    flags: tuple[str, ...] = ()
    needs: dict[str, tuple[str, str]] = field(default_factory=dict)
    options: Callable[[RunConfig], Any] = lambda run: None
    min_batch: Callable[[RunConfig], int] = lambda run: 1
    replicas: Callable[[RunConfig], int] = lambda run: len(run.devices)
    one_device: bool = False
    job: JobOptions | None = None
    steps_per_batch: Callable[[RunConfig, Checkpoint | None], int | None] = lambda run, ckpt: 1

    def refuse_foreign_flags(self, given: dict[str, object]) -> None:
        """Refuse strategy flags that belong to another strategy, or that
        this one takes only under another flag's value it was not given.

        Args:
            given: flag -> value for every strategy flag (None: not given).

        Raises:
            CliError: a flag was given that this strategy does not take, or
                without the value of another flag it needs.
        """
        for flag, value in given.items():
            if value is not None and flag not in self.flags:
                owners = [s.name for s in STRATEGIES.values() if flag in s.flags]
                raise CliError(f"{flag} only applies to --strategy {' or '.join(owners)}")
        for flag, (other, needed) in self.needs.items():
            if given.get(flag) is not None and given.get(other) != needed:
                raise CliError(f"{flag} only applies to {other} {needed}")


def _pipeline_options(run: RunConfig) -> PipelineOptions:
    if run.schedule is None:
        return PipelineOptions(micro_batch_size=run.micro_batch_size)
    return PipelineOptions(
        micro_batch_size=run.micro_batch_size, schedule=Schedule.parse(run.schedule)
    )


def _data_settings(run: RunConfig) -> dict[str, Any]:
    """`--policy` and `--average-every` as `DataParallelOptions` fields."""
    settings: dict[str, Any] = {}
    if run.policy is not None:
        settings["policy"] = ApplyPolicy(run.policy)
    if run.average_every is not None:
        settings["average_every"] = run.average_every
    return settings


def _data_options(run: RunConfig) -> DataParallelOptions:
    return DataParallelOptions(**_data_settings(run))


def _data_job(run: RunConfig, dist: DistributedTrainConfig, collective: Any) -> tuple[Any, Any]:
    options = DataParallelOptions.for_job(
        dist, process_collective=collective, **_data_settings(run)
    )
    return DataParallelTrainer, options


def _data_steps_per_batch(run: RunConfig, ckpt: Checkpoint | None) -> int | None:
    """One step per batch when synchronous (under the policy the checkpoint
    was saved with, where it says); a cadence round spans several batches,
    and local SGD counts each replica's own steps."""
    policy = run.policy if ckpt is None else ckpt.extra.get("policy", run.policy)
    return 1 if policy in (None, ApplyPolicy.SYNC.value) else None


def _zero_options(run: RunConfig) -> ShardedOptions:
    return ShardedOptions(stage=run.zero_stage or 1)


def _zero_job(run: RunConfig, dist: DistributedTrainConfig, collective: Any) -> tuple[Any, Any]:
    options = ShardedOptions.for_job(dist, process_collective=collective, stage=run.zero_stage or 1)
    return ShardedDataParallelTrainer, options


def _ps_workers(run: RunConfig) -> int:
    return run.workers or len(run.devices)


def _ps_steps_per_batch(run: RunConfig, ckpt: Checkpoint | None) -> int:
    """Asynchronous: each worker's part of a batch is a step (the workers of
    the run that saved it, where its checkpoint says).

    Raises:
        CliError: the checkpoint names a count of workers that is none (a
            bool, a float, below 1, beyond `INDEX_MAX`).
    """
    if ckpt is None or "workers" not in ckpt.extra:
        return _ps_workers(run)
    try:
        return int_at_least("workers", ckpt.extra["workers"])
    except (TypeError, ValueError) as exc:
        raise CliError(f"--resume: the checkpoint's {exc}") from None


def _ps_options(run: RunConfig) -> ParameterServerOptions:
    return ParameterServerOptions(workers=run.workers)


STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in (
        Strategy("single", "one device", Trainer, one_device=True, job=_data_job),
        Strategy(
            "data",
            "data parallel: replicas all-reduce their gradients",
            DataParallelTrainer,
            flags=("--policy", "--average-every"),
            needs={"--average-every": ("--policy", "async")},
            options=_data_options,
            min_batch=lambda run: len(run.devices),
            job=_data_job,
            steps_per_batch=_data_steps_per_batch,
        ),
        Strategy(
            "zero",
            "sharded data parallel (ZeRO): optimizer state, gradients, parameters split",
            ShardedDataParallelTrainer,
            flags=("--zero-stage",),
            options=_zero_options,
            min_batch=lambda run: len(run.devices),
            job=_zero_job,
        ),
        Strategy(
            "tensor",
            "tensor parallel: layers split across devices",
            TensorParallelTrainer,
            replicas=lambda run: 1,
        ),
        Strategy(
            "pipeline",
            "pipeline parallel: stages with micro-batches",
            PipelineParallelTrainer,
            flags=("--schedule", "--micro-batch-size"),
            options=_pipeline_options,
            replicas=lambda run: 1,
        ),
        Strategy(
            "ps",
            "asynchronous parameter server",
            AsyncParameterServer,
            flags=("--workers",),
            options=_ps_options,
            min_batch=_ps_workers,
            replicas=lambda run: _ps_workers(run) + 1,
            steps_per_batch=_ps_steps_per_batch,
        ),
    )
}


def saved_steps_per_batch(run: RunConfig, ckpt: Checkpoint) -> int | None:
    """The optimizer steps per batch that `ckpt`'s step counts: by the
    strategy that saved it (its `extra["trainer"]`), which a resume under
    another strategy does not change; by this run's strategy where the
    checkpoint does not say. None: that count varies."""
    saved = ckpt.extra.get("trainer")
    strategy = next(
        (s for s in STRATEGIES.values() if s.trainer.__name__ == saved), STRATEGIES[run.strategy]
    )
    return strategy.steps_per_batch(run, ckpt)


def min_batch_size(run: RunConfig) -> int:
    """The smallest batch that gives every replica or worker a sample."""
    if run.dist is not None:
        return run.dist.world_size * len(run.devices)
    return STRATEGIES[run.strategy].min_batch(run)


async def _spawn_distributed(
    system: Any, run: RunConfig, model: Sequential, config: TrainerConfig, job: Job
) -> ActorRef:
    assert run.dist is not None and job.collective is not None
    build = STRATEGIES[run.strategy].job
    assert build is not None  # run_args refuses --distributed with the others
    trainer, options = build(run, run.dist, job.collective)
    return await trainer.spawn(system, model, list(run.devices), config, options)


async def spawn_trainer(
    system: Any, run: RunConfig, model: Sequential, config: TrainerConfig, job: Job
) -> ActorRef:
    """Spawn the trainer of `run.strategy` on `run.devices`.

    Args:
        system: the `ActorSystem`.
        run: the run's options (strategy, devices, schedule, workers, ...).
        model: the initial model.
        config: optimizer, loss and clipping.
        job: the run's `Job` (`open_job`).

    Returns:
        The trainer.

    Raises:
        CliError: the trainer refused the options (for example more
            pipeline stages than layers).
        OtherProcessFailed: under `--distributed`, another rank failed to start
            its trainer (named; this rank's trainer was stopped).
        CollectiveError: under `--distributed`, a rank was lost during the
            trainer's start (the agreement, the initial weights' broadcast).
    """
    try:
        if run.dist is not None:
            return await _spawn_distributed(system, run, model, config, job)
        strategy = STRATEGIES[run.strategy]
        options = strategy.options(run)
        ref = await strategy.trainer.spawn(system, model, list(run.devices), config, options)
    except (ValueError, TypeError) as exc:
        raise CliError(f"--strategy {run.strategy}: {exc}") from None
    return ref
