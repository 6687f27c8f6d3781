"""`train_epochs`: the epoch loop shared by every strategy.

Each epoch shuffles the training set with `default_rng([seed, epoch])`, sends
one `Step` per batch, then evaluates on the whole training and test sets.
Because the order depends only on the seed and the epoch, a resumed run
continues at exactly the batch where the checkpoint was taken.

Checkpoints (`--checkpoint`) are written after every epoch, at the end, and
when the run is stopped (Ctrl-C); next to each one a history file
(`<checkpoint>.history.json`) keeps the epoch records and the position, which
`--resume` reads back.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from atomr.actor import ActorSystem
from atomr.cli.dataset import Dataset
from atomr.cli.errors import CliError
from atomr.cli.history import EpochRecord, History
from atomr.cli.interrupt import StopFlag
from atomr.cli.progress import Progress
from atomr.cli.run_config import RunConfig
from atomr.cli.strategies import spawn_trainer
from atomr.cli.trainer_handle import TrainerHandle
from atomr.train import Checkpoint, CheckpointError, Mlp, StepStats, load_checkpoint

__all__ = ["Position", "history_path_for", "train_epochs"]


def history_path_for(checkpoint: Path) -> Path:
    """Where the history written next to `checkpoint` lives."""
    return checkpoint.with_name(checkpoint.name + ".history.json")


@dataclass
class Position:
    """Where training stands.

    Attributes:
        epoch: 0-based epoch in progress (or next to start).
        batch: next batch of that epoch.
        step: optimizer steps applied so far (all runs).
    """

    epoch: int = 0
    batch: int = 0
    step: int = 0


@dataclass
class _EpochTally:
    loss_sum: float = 0.0
    samples: int = 0
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def mean_loss(self) -> float:
        return self.loss_sum / self.samples if self.samples else math.nan

    @property
    def rate(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0


def min_batch(run: RunConfig) -> int:
    """The smallest batch that gives every replica or worker at least one sample."""
    if run.dist is not None:
        return run.dist.world_size * len(run.devices)
    if run.strategy in ("data", "ps"):
        return max(len(run.devices), run.workers or 1)
    return 1


def batch_bounds(n: int, run: RunConfig) -> list[tuple[int, int]]:
    """The `[start, stop)` bounds of an epoch's batches; a tail batch too
    small to split across the devices is dropped.

    Raises:
        CliError: the batch size itself is too small for the strategy.
    """
    smallest = min_batch(run)
    if run.batch_size < smallest:
        raise CliError(
            f"--batch-size {run.batch_size} is too small for --strategy {run.strategy} "
            f"on {len(run.devices)} device(s): use at least {smallest}"
        )
    bounds = [(s, min(s + run.batch_size, n)) for s in range(0, n, run.batch_size)]
    if bounds and bounds[-1][1] - bounds[-1][0] < smallest:
        bounds.pop()
    if not bounds:
        raise CliError(f"the training set ({n} samples) is smaller than one batch")
    return bounds


def _targets(labels: np.ndarray, run: RunConfig, classes: int) -> np.ndarray:
    """Class labels for cross-entropy; one-hot float32 targets for MSE."""
    if run.loss != "mse":
        return labels
    onehot = np.zeros((labels.shape[0], classes), dtype=np.float32)
    onehot[np.arange(labels.shape[0]), labels] = 1.0
    return onehot


async def _evaluate(
    trainer: TrainerHandle, model: Mlp, x: np.ndarray, y: np.ndarray, run: RunConfig, classes: int
) -> tuple[float, float]:
    """(loss, accuracy) on a set; accuracy of MSE runs from the weights' arg-max."""
    result = await trainer.evaluate(x, _targets(y, run, classes))
    accuracy = result.accuracy
    if not math.isfinite(accuracy):
        host = Mlp.from_params(model.sizes, await trainer.weights(), activation=run.activation)
        outputs = host.backend.to_host(host.forward(host.backend.to_device(x)))
        accuracy = float(np.mean(np.argmax(outputs, axis=1) == y))
    return float(result.loss), float(accuracy)


def _resume_position(
    run: RunConfig, path: Path, steps_per_epoch: int, history: History, sizes: list[int]
) -> Position:
    """Read where the checkpoint stands; restore the earlier epoch records."""
    try:
        ckpt = load_checkpoint(path)
    except (CheckpointError, OSError) as exc:
        raise CliError(f"--resume: {exc}") from None
    _check_model_options(run, ckpt, sizes)
    _check_optimizer_options(run, ckpt)
    side = history_path_for(path)
    if side.is_file():
        try:
            earlier = History.load(side)
        except (OSError, ValueError) as exc:
            raise CliError(f"--resume: {exc}") from None
        pos = earlier.position or {}
        if pos.get("data") != run.data_options():
            raise CliError(
                f"--resume: the checkpoint was made with {pos.get('data')}; "
                f"resume with the same data options (got {run.data_options()})"
            )
        history.epochs = list(earlier.epochs)
        return Position(int(pos["epoch"]), int(pos["batch"]), int(pos["step"]))
    # a checkpoint without a history (saved by a script): infer from its step count
    return Position(ckpt.step // steps_per_epoch, ckpt.step % steps_per_epoch, ckpt.step)


def _check_model_options(run: RunConfig, ckpt: Checkpoint, sizes: list[int]) -> None:
    """Refuse a checkpoint of another model, naming the options that rebuild it."""
    saved = ckpt.model.get("sizes")
    activation = ckpt.model.get("activation")
    if not isinstance(saved, list) or len(saved) < 2:
        return  # malformed config: the trainer's LoadCheckpoint reports it
    if saved == sizes and activation == run.activation:
        return
    if saved[0] != sizes[0] or saved[-1] != sizes[-1]:
        fix = "the same data set (--dataset, --features, --classes)"
    elif len(saved) == 2:
        fix = "the library: the command line always builds a hidden layer"
    else:
        fix = f"--hidden {','.join(map(str, saved[1:-1]))} --activation {activation}"
    shape = "-".join(map(str, saved))
    mine = "-".join(map(str, sizes))
    raise CliError(
        f"--resume: the checkpoint is of a {shape} {activation} model, not {mine} "
        f"{run.activation}; resume with {fix}"
    )


def _check_optimizer_options(run: RunConfig, ckpt: Checkpoint) -> None:
    """Refuse to resume with other `--optimizer`, `--lr` or (SGD) `--momentum`
    values than the checkpoint's: loading a checkpoint restores its optimizer's
    hyper-parameters, so different values would be silently ignored."""
    saved = ckpt.optimizer.get("kind")
    if not isinstance(saved, dict):
        return  # malformed state: the trainer's LoadCheckpoint reports it
    mine = run.trainer_config().optimizer
    flags = {"--optimizer": ("name", mine.name), "--lr": ("lr", mine.lr)}
    if mine.name == "sgd":
        flags["--momentum"] = ("momentum", mine.momentum)
    for flag, (key, value) in flags.items():
        if saved.get(key) != value:
            raise CliError(
                f"--resume: the checkpoint was trained with {key} {saved.get(key)!r}, "
                f"not {value!r}; resume with the same {flag} (a checkpoint keeps its "
                "optimizer's hyper-parameters)"
            )


def _record_position(run: RunConfig, history: History, position: Position) -> None:
    history.position = {
        "epoch": position.epoch,
        "batch": position.batch,
        "step": position.step,
        "data": run.data_options(),
    }


async def _checkpoint(
    trainer: TrainerHandle, run: RunConfig, history: History, position: Position
) -> None:
    assert run.checkpoint is not None
    await trainer.save(run.checkpoint)
    _record_position(run, history, position)
    if trainer.is_root:
        history.save(history_path_for(run.checkpoint))


async def train_epochs(
    run: RunConfig,
    data: Dataset,
    history: History,
    stop: StopFlag,
    progress_factory: Callable[[int, int], Progress] | None = None,
    on_step: Callable[[Position, StepStats], None] | None = None,
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
        on_step: called after every step with the position and the stats.

    Returns:
        `history`.

    Raises:
        CliError: options the trainer refuses, an unusable checkpoint, or a
            finished checkpoint with nothing left to train.
    """
    started = time.perf_counter()
    sizes = [data.features, *run.hidden, data.classes]
    history.config["sizes"] = sizes
    model = Mlp(sizes, activation=run.activation, seed=run.seed)
    bounds = batch_bounds(data.x_train.shape[0], run)
    position = Position()
    if run.resume is not None:
        position = _resume_position(run, run.resume, len(bounds), history, sizes)
        history.resumed_from = str(run.resume)
        if position.epoch >= run.epochs:
            raise CliError(
                f"--resume: the checkpoint has finished {position.epoch} epoch(s); "
                f"pass --epochs greater than {position.epoch} to train further"
            )
    async with ActorSystem("atomr-train") as system:
        trainer = await spawn_trainer(system, run, model, run.trainer_config())
        if run.resume is not None:
            try:
                await trainer.load(run.resume)
            except (CheckpointError, OSError) as exc:
                raise CliError(f"--resume: {exc}") from None
        total = run.epochs * len(bounds)
        done = position.epoch * len(bounds) + position.batch
        progress = progress_factory(total, done) if progress_factory else Progress(0, 0, False)
        if history.last is not None:
            progress.set_accuracy(history.last.test_accuracy)
        try:
            history.status = await _loop(
                run, data, trainer, model, bounds, position, history, stop, progress, on_step
            )
        except Exception as exc:
            trainer.abort_job(exc)
            raise
        finally:
            progress.close()
        _record_position(run, history, position)
        if run.checkpoint is not None:
            await _checkpoint(trainer, run, history, position)
    history.wall_seconds = time.perf_counter() - started
    return history


async def _loop(
    run: RunConfig,
    data: Dataset,
    trainer: TrainerHandle,
    model: Mlp,
    bounds: list[tuple[int, int]],
    position: Position,
    history: History,
    stop: StopFlag,
    progress: Progress,
    on_step: Callable[[Position, StepStats], None] | None,
) -> str:
    """The epochs themselves; returns the final status."""
    n = data.x_train.shape[0]
    while position.epoch < run.epochs:
        progress.set_epoch(position.epoch + 1, run.epochs)
        order = np.random.default_rng([run.seed, position.epoch]).permutation(n)
        tally = _EpochTally()
        while position.batch < len(bounds):
            start, stop_at = bounds[position.batch]
            idx = order[start:stop_at]
            x = np.ascontiguousarray(data.x_train[idx])
            y = _targets(data.y_train[idx], run, data.classes)
            t0 = time.perf_counter()
            stats = await trainer.step(x, y)
            tally.seconds += time.perf_counter() - t0
            tally.loss_sum += stats.loss * stats.samples
            tally.samples += stats.samples
            position.batch += 1
            if stats.applied:
                position.step += 1
            progress.update(stats, tally.mean_loss, tally.rate)
            if on_step is not None:
                on_step(position, stats)
            if stop.requested and trainer.stops_between_steps:
                return "interrupted"
        train_loss, train_acc = await _evaluate(
            trainer, model, data.x_train, data.y_train, run, data.classes
        )
        test_loss, test_acc = await _evaluate(
            trainer, model, data.x_test, data.y_test, run, data.classes
        )
        del train_loss  # the epoch's mean step loss is the training curve
        record = EpochRecord(
            epoch=position.epoch + 1,
            step=position.step,
            train_loss=tally.mean_loss,
            train_accuracy=train_acc,
            test_loss=test_loss,
            test_accuracy=test_acc,
            samples_per_s=tally.rate,
            seconds=tally.seconds,
        )
        history.epochs.append(record)
        progress.epoch_done(record, run.epochs)
        position.epoch += 1
        position.batch = 0
        if await trainer.agree_to_stop(stop.requested) and position.epoch < run.epochs:
            return "interrupted"
        if run.checkpoint is not None and position.epoch < run.epochs:
            await _checkpoint(trainer, run, history, position)
    return "finished"
