"""`train_epochs`: an `atomr train` run on the library's one fit loop.

The loop itself is `atomr.train.fit`; this module adds what belongs to the
command: building the model and trainer from the options, resuming where a
checkpoint stands (`resume.py` says where), and writing the history file
next to every checkpoint (`<checkpoint>.history.json`: the epoch records,
the position and the save's digest, which `--resume` reads back).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from atomr.actor import ActorRef, ActorSystem
from atomr.cli.agreement import shared_options
from atomr.cli.dataset import Dataset, data_digest
from atomr.cli.errors import CliError
from atomr.cli.history import History, history_path_for
from atomr.cli.job import Job, open_job
from atomr.cli.progress import Progress
from atomr.cli.resume import check_something_left, resume_position
from atomr.cli.run_config import RunConfig
from atomr.cli.strategies import STRATEGIES, min_batch_size, spawn_trainer
from atomr.train import Evaluate, GetWeights, Mlp
from atomr.train.core.checkpoint import checkpoint_digest
from atomr.train.core.model import Sequential
from atomr.train.fit import Evaluator, FitCallback, FitPosition, StopFlag, batch_bounds, fit

__all__ = ["RunStart", "plan_start", "train_epochs"]

_ASK_TIMEOUT = 600.0  # generous: one step of a large synthetic run may take a while


@dataclass(frozen=True)
class RunStart:
    """Where a run starts, worked out from its options, its data and its
    `--resume` checkpoint before anything is built (`plan_start`).

    Attributes:
        steps: batches per epoch.
        updates: optimizer updates per epoch (a learning-rate schedule counts them).
        position: where the fit loop starts (the beginning without `--resume`).
        checkpoint: the digest of the `--resume` checkpoint (which save it
            is: `save_digest`, a sharded index's shard files included), or None.
        data: under `--distributed`, the digest of the data set loaded
            (`data_digest`), which the ranks compare; else None.
    """

    steps: int
    updates: int
    position: FitPosition = field(default_factory=FitPosition)
    checkpoint: str | None = None
    data: str | None = None


def plan_start(run: RunConfig, data: Dataset, history: History) -> RunStart:
    """Where `run` starts on `data` (and, under `--distributed`, which data
    that is); fills in `history`'s Mlp sizes (none for a GPT) and, resuming, the
    checkpoint's earlier epochs, run id and `resumed_from`.

    Raises:
        CliError: a batch size too small for the strategy, a training set
            with no batch, a schedule under a policy whose updates per batch
            vary; resuming, an unusable checkpoint or one of other options,
            or one with nothing left to train.
    """
    if run.gpt is None:  # an Mlp's widths (a GPT's shape is history.config["gpt"])
        history.config["sizes"] = [data.features, *run.hidden, data.classes]
    steps = _steps_per_epoch(run, data)
    updates = _updates_per_epoch(run, steps)
    digest = data_digest(data) if run.dist is not None else None
    if run.resume is None:
        return RunStart(steps, updates, data=digest)
    resumed = resume_position(run, run.resume, steps, updates, history)
    history.resumed_from = str(run.resume)
    check_something_left(run, resumed.position, resumed.trainer_step)
    return RunStart(steps, updates, resumed.position, resumed.checkpoint, digest)


def _targets(labels: np.ndarray, run: RunConfig, classes: int) -> np.ndarray:
    """Class labels for cross-entropy; one-hot float32 targets for MSE."""
    if run.loss != "mse":
        return labels
    onehot = np.zeros((labels.shape[0], classes), dtype=np.float32)
    onehot[np.arange(labels.shape[0]), labels] = 1.0
    return onehot


class _HistoryKeeper(FitCallback):
    """Keeps the run's `History`: epoch records, and the position written next
    to every checkpoint (by the process that writes files)."""

    def __init__(self, run: RunConfig, history: History, is_root: bool) -> None:
        self.run, self.history, self.is_root = run, history, is_root

    def record_position(self, position: FitPosition, checkpoint: Path | None = None) -> None:
        """Where the run stands; with `checkpoint`, the digest of the save it
        was written with (`--resume` trusts only that save's position)."""
        self.history.position = {
            "epoch": position.epoch,
            "batch": position.batch,
            "step": position.step,
            "data": self.run.data_options(),
            "loss": self.run.loss,
        }
        if checkpoint is not None:
            self.history.position["checkpoint"] = checkpoint_digest(checkpoint)

    def on_epoch_end(self, record: object, epochs: int) -> None:
        self.history.epochs.append(record)  # type: ignore[arg-type]

    def on_checkpoint(self, path: Path, position: FitPosition) -> None:
        if not self.is_root:
            self.record_position(position)
            return
        self.record_position(position, path)
        self.history.save(history_path_for(path))


def _mse_evaluator(trainer: ActorRef, run: RunConfig, model: Mlp) -> Evaluator:
    """MSE runs: the loss from `Evaluate`, the accuracy from the weights' arg-max."""

    async def evaluate(x: np.ndarray, targets: np.ndarray) -> tuple[float, float]:
        result = await trainer.ask(Evaluate(x, targets), timeout=_ASK_TIMEOUT)
        weights = await trainer.ask(GetWeights(), timeout=_ASK_TIMEOUT)
        host = Mlp.from_params(model.sizes, weights, activation=run.activation)
        outputs = host.backend.to_host(host.forward(host.backend.to_device(x)))
        accuracy = float(np.mean(np.argmax(outputs, axis=1) == np.argmax(targets, axis=1)))
        return float(result.loss), accuracy

    return evaluate


def _progress(
    history: History,
    start: FitPosition,
    steps: int,
    epochs: int,
    factory: Callable[[int, int], Progress] | None,
) -> Progress:
    """The progress bar, counting the steps a resumed run has done already."""
    total, done = epochs * steps, start.epoch * steps + start.batch
    progress = factory(total, done) if factory else Progress(0, 0, False)
    if history.last is not None:
        progress.set_accuracy(history.last.test_accuracy)
    return progress


async def _start_trainer(
    system: ActorSystem, run: RunConfig, data: Dataset, history: History, job: Job, start: RunStart
) -> tuple[ActorRef, Sequential]:
    """Build the model, spawn the trainer, load the `--resume` checkpoint
    into it (the save `start` was planned from) and make the checkpoint's folder (where this process writes
    files); returns the trainer and the initial model.

    Raises:
        CliError: options the trainer refuses, a checkpoint it cannot load
            or that another save replaced since the run was planned.
        OtherProcessFailed: another rank failed to start its trainer.
        CollectiveError: a rank was lost while the trainers started.
        OSError: the checkpoint's folder cannot be made.
    """
    model = _model(run, data, history)
    trainer = await spawn_trainer(system, run, model, run.trainer_config(start.updates), job)
    if run.resume is not None:
        await job.load(trainer, run.resume, start.checkpoint)
    if run.checkpoint is not None and job.is_root:
        run.checkpoint.parent.mkdir(parents=True, exist_ok=True)
    return trainer, model


async def _train(
    system: ActorSystem,
    run: RunConfig,
    data: Dataset,
    history: History,
    planned: RunStart,
    progress: Callable[[], Progress],
    callbacks: Sequence[FitCallback],
    stop: StopFlag,
    on_weights: Callable[[np.ndarray], None] | None,
    job: Job,
) -> str:
    # after the ranks agreed, a failure is this rank's alone (`failed` tells
    # the others); a rank lost in a collective ends the job (`abort`)
    with job.aborting(alone=True):
        trainer, model = await _start_trainer(system, run, data, history, job, planned)
        keeper = _HistoryKeeper(run, history, job.is_root)
        bar = progress()  # only once the trainer took the options: errors stay one line
        try:
            result = await fit(
                trainer,
                (data.x_train, _targets(data.y_train, run, data.classes)),
                validation=(data.x_test, _targets(data.y_test, run, data.classes)),
                epochs=run.epochs,
                batch_size=run.batch_size,
                seed=run.seed,
                start=planned.position,
                checkpoint=run.checkpoint,
                callbacks=[keeper, bar, *callbacks],
                stop=stop,
                agree_to_stop=job.agree_to_stop,
                evaluate=_mse_evaluator(trainer, run, model)
                if isinstance(model, Mlp) and run.loss == "mse"
                else None,
                min_batch_size=min_batch_size(run),
                timeout=_ASK_TIMEOUT,
            )
            if on_weights is not None:
                on_weights(await trainer.ask(GetWeights(), timeout=_ASK_TIMEOUT))
        finally:
            bar.close()
    keeper.record_position(result.position)
    return result.status


def _model(run: RunConfig, data: Dataset, history: History) -> Sequential:
    """The run's initial model: its GPT (`--model gpt`) or its MLP."""
    if run.gpt is not None:
        return run.gpt.build(data.classes, run.seed)
    return Mlp(list(history.config["sizes"]), activation=run.activation, seed=run.seed)


async def train_epochs(
    run: RunConfig,
    data: Dataset,
    history: History,
    stop: StopFlag,
    progress_factory: Callable[[int, int], Progress] | None = None,
    callbacks: Sequence[FitCallback] = (),
    on_weights: Callable[[np.ndarray], None] | None = None,
    job: Job | None = None,
    start: RunStart | None = None,
) -> History:
    """Train `run.epochs` epochs (in total, counting a resumed run's) on `data`.

    Args:
        run: the run's options.
        data: the data set.
        history: filled in place: one `EpochRecord` per finished epoch, the
            status ("finished" or "interrupted") and the wall time.
        stop: checked after every step; once set the run saves its
            checkpoint (if `run.checkpoint`) and returns, status "interrupted".
        progress_factory: `(total_steps, done_steps) -> Progress`, or None
            for no progress output.
        callbacks: more `FitCallback`s (after the progress bar).
        on_weights: given the trained weights at the end (the GPT's sample).
        job: the run's `Job` (`open_job`); default: opened here, once the
            start is planned (collective under `--distributed`).
        start: where the run starts (`plan_start`, with `history`);
            default: planned here.

    Returns:
        `history`.

    Raises:
        CliError: options the trainer refuses, or as `plan_start` (an
            unusable checkpoint, nothing left to train) and `open_job`
            (ranks given different options).
    """
    started = time.perf_counter()
    if start is None:
        start = plan_start(run, data, history)
    if job is None:
        job = await open_job(run.dist, shared_options(run, start))
    planned = start
    async with ActorSystem("atomr-train") as system:
        history.status = await _train(
            system,
            run,
            data,
            history,
            planned,
            lambda: _progress(
                history, planned.position, planned.steps, run.epochs, progress_factory
            ),
            callbacks,
            stop,
            on_weights,
            job,
        )
    history.wall_seconds = time.perf_counter() - started
    return history


def _updates_per_epoch(run: RunConfig, steps: int) -> int:
    """The optimizer updates an epoch of `steps` batches makes, which a
    learning-rate schedule counts: a batch is one update, or one per
    parameter-server worker.

    Raises:
        CliError: a schedule under a data policy whose update count per
            batch varies (async, cadence).
    """
    per_batch = STRATEGIES[run.strategy].steps_per_batch(run, None)
    if per_batch is None:
        if run.lr_schedule != "constant" or run.warmup_epochs:
            raise CliError(
                f"--lr-schedule and --warmup-epochs need --policy sync: under --policy "
                f"{run.policy} a replica's updates per batch vary, so the schedule cannot be "
                "sized (docs/data_parallel.md shows how to give one through the library)"
            )
        per_batch = 1
    return steps * per_batch


def _steps_per_epoch(run: RunConfig, data: Dataset) -> int:
    """Batches per epoch (a tail too small to split across the devices is dropped).

    Raises:
        CliError: the batch size is too small for the strategy, or the
            training set holds no batch.
    """
    smallest = min_batch_size(run)
    if run.batch_size < smallest:
        raise CliError(
            f"--batch-size {run.batch_size} is too small for --strategy {run.strategy} "
            f"on {len(run.devices)} device(s): use at least {smallest}"
        )
    try:
        return len(batch_bounds(data.x_train.shape[0], run.batch_size, smallest))
    except ValueError as exc:
        raise CliError(str(exc)) from None
