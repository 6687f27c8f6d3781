"""`train_epochs`: an `atomr train` run on the library's one fit loop.

The loop itself is `atomr.train.fit`; this module adds what belongs to the
command: building the model and trainer from the options, resuming from a
checkpoint and its history file, and writing that history file next to
every checkpoint (`<checkpoint>.history.json`: the epoch records and the
position, which `--resume` reads back).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from atomr.actor import ActorRef, ActorSystem
from atomr.cli.dataset import Dataset
from atomr.cli.errors import CliError
from atomr.cli.history import History, history_path_for
from atomr.cli.progress import Progress
from atomr.cli.run_config import RunConfig
from atomr.cli.strategies import STRATEGIES, min_batch_size, spawn_trainer
from atomr.train import CheckpointError, Evaluate, GetWeights, Mlp, load_checkpoint
from atomr.train.core import Checkpoint
from atomr.train.core.checkpoint import checkpoint_digest
from atomr.train.core.model import Sequential
from atomr.train.fit import Evaluator, FitCallback, FitPosition, StopFlag, batch_bounds, fit

__all__ = ["train_epochs"]

_ASK_TIMEOUT = 600.0  # generous: one step of a large synthetic run may take a while


def _targets(labels: np.ndarray, run: RunConfig, classes: int) -> np.ndarray:
    """Class labels for cross-entropy; one-hot float32 targets for MSE."""
    if run.loss != "mse":
        return labels
    onehot = np.zeros((labels.shape[0], classes), dtype=np.float32)
    onehot[np.arange(labels.shape[0]), labels] = 1.0
    return onehot


def _resume_position(
    run: RunConfig, path: Path, steps: int, history: History
) -> tuple[FitPosition, int]:
    """Where the checkpoint stands (the fit loop's position and the
    trainer's own step count), and the earlier epoch records: from its
    history file when that file was written with this very checkpoint (its
    digest says so), else from the checkpoint's own step where the strategy
    takes a fixed number of steps per batch (with a warning on stderr).

    Raises:
        CliError: an unusable checkpoint, another model or optimizer, a
            history file of other data options, or a strategy whose steps
            per batch vary with no history file of this checkpoint.
    """
    try:
        ckpt = load_checkpoint(path)
        digest = checkpoint_digest(path)
    except (CheckpointError, OSError) as exc:
        raise CliError(f"--resume: {exc}") from None
    _check_model_kind(run, ckpt)
    if run.gpt is None:  # a GPT's layers are checked by the trainer's LoadCheckpoint
        _check_model_options(run, ckpt, list(history.config["sizes"]))
    _check_optimizer_options(run, ckpt, steps)
    earlier = _history_of(path, digest, ckpt.step)
    if earlier is None:
        return _position_from_step(run, path, ckpt, steps), ckpt.step
    saved = earlier.position or {}
    if saved.get("data") != run.data_options():
        raise CliError(
            f"--resume: the checkpoint was made with {saved.get('data')}; "
            f"resume with the same data options (got {run.data_options()})"
        )
    try:
        position = FitPosition(int(saved["epoch"]), int(saved["batch"]), int(saved["step"]))
    except (KeyError, TypeError, ValueError):
        return _position_from_step(run, path, ckpt, steps), ckpt.step
    history.epochs = [r for r in earlier.epochs if r.epoch <= position.epoch]
    return position, ckpt.step


def _history_of(path: Path, digest: str, step: int) -> History | None:
    """The history file written with the checkpoint at `path`, or None (with
    a warning when there is one of another save)."""
    side = history_path_for(path)
    if not side.is_file():  # a checkpoint saved by a script: nothing more to restore
        return None
    try:
        earlier = History.load(side)
        saved = earlier.position or {}
        sidecar_step = int(saved["step"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        _warn(f"--resume: ignoring {side} ({exc}); earlier epochs are not restored")
        return None
    # history files from before digests were kept match by step alone
    same = saved["checkpoint"] == digest if "checkpoint" in saved else sidecar_step == step
    if not same:
        _warn(
            f"--resume: ignoring {side}: it was written with another save of the checkpoint "
            f"(step {sidecar_step}, the checkpoint's {step}); earlier epochs are not restored"
        )
        return None
    return earlier


def _position_from_step(run: RunConfig, path: Path, ckpt: Checkpoint, steps: int) -> FitPosition:
    """The position a checkpoint's step gives, where each batch is a fixed
    number of the strategy's steps.

    Raises:
        CliError: the strategy's steps per batch vary (or do not divide it).
    """
    step = ckpt.step
    per_batch = STRATEGIES[run.strategy].steps_per_batch(run, ckpt)
    if per_batch is None or step % per_batch:
        raise CliError(
            f"--resume: --strategy {run.strategy} does not take a fixed number of steps per "
            f"batch, so the checkpoint's step {step} does not say where in the data it stands; "
            f"resume with the history file written beside it ({history_path_for(path).name})"
        )
    batches = step // per_batch
    return FitPosition(batches // steps, batches % steps, batches)


def _check_something_left(run: RunConfig, start: FitPosition, trainer_step: int) -> None:
    """Refuse a resume with nothing left to train (no epoch, or no step
    under `--max-steps`, which counts the trainer's own steps)."""
    if start.epoch >= run.epochs:
        scheduled = run.lr_schedule != "constant" or run.warmup_epochs > 0
        schedule = " (the end of its --lr-schedule)" if scheduled else ""
        raise CliError(
            f"--resume: the checkpoint has finished {start.epoch} epoch(s){schedule}; "
            f"pass --epochs greater than {start.epoch} to train further"
            + ("" if not schedule else ", without a schedule or with a new one from the start")
        )
    if run.max_steps is not None and trainer_step >= run.max_steps:
        raise CliError(
            f"--resume: the checkpoint is at step {trainer_step}, at or past --max-steps "
            f"{run.max_steps}; pass a larger --max-steps to train further"
        )


def _warn(message: str) -> None:
    """One warning line on stderr (the run goes on)."""
    print(f"atomr: warning: {message}", file=sys.stderr)


def _check_model_kind(run: RunConfig, ckpt: Checkpoint) -> None:
    """Refuse a checkpoint of the other `--model` (an Mlp's config has its
    `sizes`; a GPT's is a `Sequential` of layers)."""
    is_mlp = "sizes" in ckpt.model
    if is_mlp == (run.gpt is None):
        return
    saved, mine = ("mlp", "gpt") if is_mlp else ("gpt", "mlp")
    raise CliError(
        f"--resume: the checkpoint is of a --model {saved} model, not --model {mine}; "
        f"resume with --model {saved} and the options it was trained with"
    )


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


def _check_optimizer_options(run: RunConfig, ckpt: Checkpoint, steps: int) -> None:
    """Refuse to resume with other `--optimizer`, `--lr`, (SGD) `--momentum`
    or learning-rate schedule than the checkpoint's: loading a checkpoint
    restores its optimizer's hyper-parameters and schedule, so different
    values would be silently ignored."""
    saved = ckpt.optimizer.get("kind")
    if not isinstance(saved, dict):
        return  # malformed state: the trainer's LoadCheckpoint reports it
    mine = run.trainer_config(steps).optimizer
    schedule = None if mine.schedule is None else mine.schedule.to_config()
    flags = {
        "--optimizer": ("name", mine.name),
        "--lr": ("lr", mine.lr),
        "--lr-schedule, --warmup-epochs and --epochs": ("schedule", schedule),
    }
    if mine.name == "sgd":
        flags["--momentum"] = ("momentum", mine.momentum)
    for flag, (key, value) in flags.items():
        if saved.get(key) == value:
            continue
        if key == "schedule":
            raise CliError(
                f"--resume: the checkpoint's learning-rate schedule is "
                f"{_described(saved.get(key))}, this run's {_described(value)}; resume with "
                f"the same {flag} (a schedule's length comes from --epochs, so a run with "
                "one cannot be extended past its end)"
            )
        raise CliError(
            f"--resume: the checkpoint was trained with {flag} {saved.get(key)}, not "
            f"{value}; resume with {flag} {saved.get(key)} (a checkpoint keeps its "
            "optimizer's hyper-parameters)"
        )


def _described(schedule: Any) -> str:
    """A schedule's config in words: `cosine (eta_min=0.0, t_max=86)`, or "none"."""
    if schedule is None:
        return "none"
    if isinstance(schedule, list):
        return ", then ".join(_described(s) for s in schedule)
    if not isinstance(schedule, dict):
        return str(schedule)
    settings = ", ".join(
        f"{k}={_described(v) if isinstance(v, dict | list) else v}"
        for k, v in sorted(schedule.items())
        if k != "kind"
    )
    return f"{schedule.get('kind', 'schedule')} ({settings})"


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


async def _train(
    system: ActorSystem,
    run: RunConfig,
    data: Dataset,
    history: History,
    start: FitPosition,
    progress: Callable[[], Progress],
    callbacks: Sequence[FitCallback],
    stop: StopFlag,
    on_weights: Callable[[np.ndarray], None] | None,
) -> str:
    model = _model(run, data, history)
    config = run.trainer_config(_steps_per_epoch(run, data))
    trainer, job = await spawn_trainer(system, run, model, config)
    if run.resume is not None:
        await job.load(trainer, run.resume)
    keeper = _HistoryKeeper(run, history, job.is_root)
    if run.checkpoint is not None and job.is_root:
        run.checkpoint.parent.mkdir(parents=True, exist_ok=True)
    bar = progress()  # only once the trainer took the options: errors stay one line
    callbacks = [keeper, bar, *callbacks]
    try:
        result = await fit(
            trainer,
            (data.x_train, _targets(data.y_train, run, data.classes)),
            validation=(data.x_test, _targets(data.y_test, run, data.classes)),
            epochs=run.epochs,
            batch_size=run.batch_size,
            seed=run.seed,
            start=start,
            checkpoint=run.checkpoint,
            callbacks=callbacks,
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
    except Exception as exc:
        job.abort(exc)
        raise
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

    Returns:
        `history`.

    Raises:
        CliError: options the trainer refuses, an unusable checkpoint, or a
            finished checkpoint with nothing left to train.
    """
    started = time.perf_counter()
    history.config["sizes"] = [data.features, *run.hidden, data.classes]
    start = FitPosition()
    steps = _steps_per_epoch(run, data)
    async with ActorSystem("atomr-train") as system:
        if run.resume is not None:
            start, trainer_step = _resume_position(run, run.resume, steps, history)
            history.resumed_from = str(run.resume)
            _check_something_left(run, start, trainer_step)
        history.status = await _train(
            system,
            run,
            data,
            history,
            start,
            lambda: _progress(history, start, steps, run.epochs, progress_factory),
            callbacks,
            stop,
            on_weights,
        )
    history.wall_seconds = time.perf_counter() - started
    return history


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
