"""`fit`: the one epoch loop, for every trainer.

Any trainer that speaks the contract (`Step`, `Evaluate`, `SaveCheckpoint`)
trains the same way: each epoch shuffles the training set with
`default_rng([seed, epoch])`, sends one `Step` per batch, then evaluates on
the training and validation sets. Because the order depends only on the seed
and the epoch, a run resumed from a `FitPosition` continues at exactly the
batch where its checkpoint was taken.

With `checkpoint=path`, the trainer saves after every epoch, at the end and
when the run is stopped; `FitCallback.on_checkpoint` hears of each save with
the position to resume from.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from atomr.actor import ActorRef
from atomr.train.core.data import epoch_order
from atomr.train.core.messages import Evaluate, SaveCheckpoint, Step
from atomr.train.core.stats import EvalResult, StepStats

__all__ = [
    "EpochRecord",
    "Evaluator",
    "FitCallback",
    "FitPosition",
    "FitResult",
    "StopFlag",
    "batch_bounds",
    "epoch_order",
    "fit",
]

Evaluator = Callable[[np.ndarray, np.ndarray], Awaitable[tuple[float, float]]]
"""`(features, labels) -> (loss, accuracy)`; the default asks the trainer to `Evaluate`."""


@dataclass
class FitPosition:
    """Where training stands.

    Attributes:
        epoch: 0-based epoch in progress (or next to start).
        batch: next batch of that epoch.
        step: optimizer steps applied so far (all runs).
    """

    epoch: int = 0
    batch: int = 0
    step: int = 0


@dataclass(frozen=True)
class EpochRecord:
    """The figures of one finished epoch.

    Attributes:
        epoch: 1-based epoch number.
        step: optimizer steps applied since the start of training (all runs).
        train_loss: mean of the step losses of this epoch (weighted by samples).
        train_accuracy: accuracy on the training set after the epoch.
        test_loss: loss on the validation set after the epoch (NaN without one).
        test_accuracy: accuracy on the validation set (NaN without one).
        samples_per_s: training throughput of this epoch (steps only).
        seconds: wall time of this epoch's steps.
    """

    epoch: int
    step: int
    train_loss: float
    train_accuracy: float
    test_loss: float
    test_accuracy: float
    samples_per_s: float
    seconds: float


@dataclass
class FitResult:
    """What `fit` did.

    Attributes:
        status: "finished", or "interrupted" when a stop was requested.
        position: where training stands now (resume from it).
        epochs: the records of the epochs this call finished.
    """

    status: str
    position: FitPosition
    epochs: list[EpochRecord] = field(default_factory=list)


class StopFlag:
    """Set when a run should stop after the step in flight (Ctrl-C, or a test)."""

    def __init__(self) -> None:
        self._requested = False

    @property
    def requested(self) -> bool:
        """True once `request` was called."""
        return self._requested

    def request(self) -> None:
        """Ask the run to stop after the current step."""
        self._requested = True


class FitCallback:
    """Hooks `fit` calls; override the ones you need (each does nothing here).

    A callback that raises ends the run with that exception.
    """

    def on_epoch_start(self, epoch: int, epochs: int) -> None:
        """Epoch `epoch` (1-based) of `epochs` starts."""

    def on_step(
        self, position: FitPosition, stats: StepStats, mean_loss: float, rate: float
    ) -> None:
        """A step finished; `mean_loss` and `rate` (samples/s) are the epoch's so far."""

    def on_epoch_end(self, record: EpochRecord, epochs: int) -> None:
        """An epoch finished and was evaluated."""

    def on_checkpoint(self, path: Path, position: FitPosition) -> None:
        """The trainer saved a checkpoint at `path`; resume it from `position`."""


def batch_bounds(n: int, batch_size: int, min_batch_size: int = 1) -> list[tuple[int, int]]:
    """The `[start, stop)` bounds of an epoch's batches; a tail batch smaller
    than `min_batch_size` is dropped.

    Raises:
        ValueError: `batch_size < min_batch_size`, or `n` holds no batch.
    """
    if batch_size < min_batch_size:
        raise ValueError(f"batch_size {batch_size} is below the smallest usable {min_batch_size}")
    bounds = [(s, min(s + batch_size, n)) for s in range(0, n, batch_size)]
    if bounds and bounds[-1][1] - bounds[-1][0] < min_batch_size:
        bounds.pop()
    if not bounds:
        raise ValueError(f"the training set ({n} samples) is smaller than one batch")
    return bounds


def _check_arrays(name: str, data: Any) -> tuple[np.ndarray, np.ndarray]:
    """A `(features, labels)` pair of equal length.

    Raises:
        TypeError: not a pair of arrays.
        ValueError: the lengths differ.
    """
    if not (isinstance(data, tuple | list) and len(data) == 2):
        raise TypeError(f"{name} must be a (features, labels) pair, got {type(data).__name__}")
    x, y = (np.asarray(a) for a in data)
    if x.ndim < 1 or y.ndim < 1 or x.shape[0] != y.shape[0]:
        raise ValueError(f"{name}: features and labels differ in length ({x.shape}, {y.shape})")
    return x, y


def _positive_int(name: str, value: Any, minimum: int = 1) -> int:
    """Raises TypeError / ValueError unless `value` is an int >= `minimum`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


@dataclass
class _Tally:
    loss_sum: float = 0.0
    samples: int = 0
    seconds: float = 0.0

    @property
    def mean_loss(self) -> float:
        return self.loss_sum / self.samples if self.samples else math.nan

    @property
    def rate(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0


@dataclass
class _Run:
    """One `fit` call's state and settings (internal)."""

    trainer: ActorRef
    x: np.ndarray
    y: np.ndarray
    validation: tuple[np.ndarray, np.ndarray] | None
    epochs: int
    seed: int
    bounds: list[tuple[int, int]]
    position: FitPosition
    callbacks: Sequence[FitCallback]
    stop: StopFlag
    agree_to_stop: Callable[[bool], Awaitable[bool]] | None
    evaluate: Evaluator
    checkpoint: Path | None
    timeout: float | None
    records: list[EpochRecord] = field(default_factory=list)

    async def save(self) -> None:
        if self.checkpoint is None:
            return
        await self.trainer.ask(SaveCheckpoint(str(self.checkpoint)), timeout=self.timeout)
        for cb in self.callbacks:
            cb.on_checkpoint(self.checkpoint, FitPosition(**vars(self.position)))

    async def train_epoch(self) -> bool:
        """The rest of the current epoch's steps; False when stopped part way."""
        order = epoch_order(self.x.shape[0], self.seed, self.position.epoch)
        tally = _Tally()
        while self.position.batch < len(self.bounds):
            start, stop_at = self.bounds[self.position.batch]
            idx = order[start:stop_at]
            t0 = time.perf_counter()
            step = Step(np.ascontiguousarray(self.x[idx]), np.ascontiguousarray(self.y[idx]))
            stats: StepStats = await self.trainer.ask(step, timeout=self.timeout)
            tally.seconds += time.perf_counter() - t0
            tally.loss_sum += stats.loss * stats.samples
            tally.samples += stats.samples
            self.position.batch += 1
            self.position.step += int(stats.applied)
            for cb in self.callbacks:
                cb.on_step(self.position, stats, tally.mean_loss, tally.rate)
            if self.stop.requested and self.agree_to_stop is None:
                return False
        await self.finish_epoch(tally)
        return True

    async def finish_epoch(self, tally: _Tally) -> None:
        _, train_acc = await self.evaluate(self.x, self.y)
        test_loss, test_acc = math.nan, math.nan
        if self.validation is not None:
            test_loss, test_acc = await self.evaluate(*self.validation)
        record = EpochRecord(
            epoch=self.position.epoch + 1,
            step=self.position.step,
            train_loss=tally.mean_loss,
            train_accuracy=train_acc,
            test_loss=test_loss,
            test_accuracy=test_acc,
            samples_per_s=tally.rate,
            seconds=tally.seconds,
        )
        self.records.append(record)
        for cb in self.callbacks:
            cb.on_epoch_end(record, self.epochs)
        self.position.epoch += 1
        self.position.batch = 0

    async def stop_now(self) -> bool:
        """At an epoch's end: whether to stop (every process agrees, in a job)."""
        if self.agree_to_stop is not None:
            return await self.agree_to_stop(self.stop.requested)
        return self.stop.requested

    async def loop(self) -> str:
        while self.position.epoch < self.epochs:
            for cb in self.callbacks:
                cb.on_epoch_start(self.position.epoch + 1, self.epochs)
            if not await self.train_epoch():
                return "interrupted"
            if self.position.epoch >= self.epochs:
                break
            if await self.stop_now():
                return "interrupted"
            await self.save()
        return "finished"


def _asking_evaluator(trainer: ActorRef, timeout: float | None) -> Evaluator:
    async def evaluate(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        result: EvalResult = await trainer.ask(Evaluate(x, y), timeout=timeout)
        return float(result.loss), float(result.accuracy)

    return evaluate


async def fit(
    trainer: ActorRef,
    train: tuple[np.ndarray, np.ndarray],
    *,
    epochs: int,
    batch_size: int,
    seed: int = 0,
    validation: tuple[np.ndarray, np.ndarray] | None = None,
    start: FitPosition | None = None,
    checkpoint: str | Path | None = None,
    callbacks: Sequence[FitCallback] = (),
    stop: StopFlag | None = None,
    agree_to_stop: Callable[[bool], Awaitable[bool]] | None = None,
    evaluate: Evaluator | None = None,
    min_batch_size: int = 1,
    timeout: float | None = 600.0,
) -> FitResult:
    """Train `trainer` for `epochs` epochs in total (a resumed run counts its
    earlier ones) on `train`.

    Args:
        trainer: any trainer's `ActorRef` (every strategy speaks the contract).
        train: `(features, labels)` arrays of equal length.
        epochs: total epochs, counting those before `start`.
        batch_size: samples per `Step`.
        seed: the shuffle seed (epoch `e` uses `default_rng([seed, e])`).
        validation: `(features, labels)` evaluated after every epoch, or None.
        start: the position to resume from (the trainer already holds the
            checkpoint's state); None starts at the beginning.
        checkpoint: save here after every epoch, at the end and on a stop.
        callbacks: `FitCallback`s, called in order.
        stop: checked after every step; once requested, the run saves its
            checkpoint and returns "interrupted".
        agree_to_stop: for the processes of a job: called at every epoch's
            end with this process's request, returns whether all stop; with
            it, `stop` is only honoured at epoch ends.
        evaluate: `(features, labels) -> (loss, accuracy)`; default: ask the
            trainer to `Evaluate`.
        min_batch_size: a tail batch smaller than this is dropped (a
            data-parallel trainer needs one sample per replica).
        timeout: seconds each ask to the trainer may take (None: no limit).

    Returns:
        The `FitResult`: status, final position, the epochs' records.

    Raises:
        TypeError, ValueError: bad arguments (checked before any step).
        Exception: whatever the trainer answered a request with (a
            `NonFiniteError`, an `AskTimeoutError`, ...).
    """
    x, y = _check_arrays("train", train)
    val = None if validation is None else _check_arrays("validation", validation)
    _positive_int("epochs", epochs)
    _positive_int("seed", seed, minimum=0)
    bounds = batch_bounds(x.shape[0], _positive_int("batch_size", batch_size), min_batch_size)
    position = FitPosition(**vars(start)) if start is not None else FitPosition()
    if position.epoch >= epochs:
        raise ValueError(f"start is at epoch {position.epoch}: pass epochs > {position.epoch}")
    if position.batch >= len(bounds):
        raise ValueError(f"start.batch {position.batch} is past the epoch's {len(bounds)} batches")
    run = _Run(
        trainer=trainer,
        x=x,
        y=y,
        validation=val,
        epochs=epochs,
        seed=seed,
        bounds=bounds,
        position=position,
        callbacks=list(callbacks),
        stop=stop if stop is not None else StopFlag(),
        agree_to_stop=agree_to_stop,
        evaluate=evaluate if evaluate is not None else _asking_evaluator(trainer, timeout),
        checkpoint=Path(checkpoint) if checkpoint is not None else None,
        timeout=timeout,
    )
    status = await run.loop()
    await run.save()
    return FitResult(status, position, run.records)
