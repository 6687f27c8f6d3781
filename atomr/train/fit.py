"""`fit`: the one epoch loop, for every trainer.

Any trainer that speaks the contract (`Step`, `Evaluate`, `SaveCheckpoint`)
trains the same way: each epoch takes its batches from the training data
(arrays, a map-style dataset or an iterable of batches: `core/sources.py`;
arrays and datasets are shuffled with `default_rng([seed, epoch])`), sends
one `Step` per batch, then evaluates on the training and validation sets.
Because the order depends only on the seed and the epoch, a run resumed from
a `FitPosition` continues at exactly the batch where its checkpoint was
taken. If the data raises part way through an epoch, the trainer first saves
its checkpoint at the position reached (nothing trained on is lost), then
`fit` raises `DataSourceError`.

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
from atomr.train.core.errors import InvalidBatchError, NonFiniteError, StepLimitError
from atomr.train.core.messages import Evaluate, GetTrainingState, SaveCheckpoint, Step
from atomr.train.core.sources import BatchSource, InvalidDataError, as_source, batch_bounds
from atomr.train.core.stats import EvalResult, StepStats, TrainingState
from atomr.train.fit_events import EpochRecord, FitCallback, FitPosition, FitResult, StopFlag

__all__ = [
    "EpochRecord",
    "Evaluator",
    "FitCallback",
    "FitPosition",
    "FitResult",
    "DataSourceError",
    "StopFlag",
    "batch_bounds",
    "epoch_order",
    "fit",
]

Evaluator = Callable[[np.ndarray, np.ndarray], Awaitable[tuple[float, float]]]
"""`(features, labels) -> (loss, accuracy)`; the default asks the trainer to `Evaluate`."""


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


class DataSourceError(RuntimeError):
    """The training data raised part way through an epoch; the trainer saved
    its checkpoint at the position reached first (see `FitCallback.on_checkpoint`)."""


@dataclass
class _Run:
    """One `fit` call's state and settings (internal)."""

    trainer: ActorRef
    train: BatchSource
    validation: BatchSource | None
    epochs: int
    batch_size: int
    position: FitPosition
    callbacks: Sequence[FitCallback]
    stop: StopFlag
    agree_to_stop: Callable[[bool], Awaitable[bool]] | None
    evaluate: Evaluator
    checkpoint: Path | None
    timeout: float | None
    max_steps: int | None = None
    records: list[EpochRecord] = field(default_factory=list)
    refused: bool = False  # the trainer refused a Step at its own limit

    def reached_max_steps(self) -> bool:
        if self.refused:
            return True
        return self.max_steps is not None and self.position.step >= self.max_steps

    async def save(self) -> None:
        if self.checkpoint is None:
            return
        await self.trainer.ask(SaveCheckpoint(str(self.checkpoint)), timeout=self.timeout)
        for cb in self.callbacks:
            cb.on_checkpoint(self.checkpoint, FitPosition(**vars(self.position)))

    async def train_epoch(self) -> bool:
        """The rest of the current epoch's steps; False when stopped part way.

        Raises:
            DataSourceError: the data raised (after the checkpoint is saved).
        """
        tally = _Tally()
        batches = self.train.batches(self.position.epoch, self.position.batch)
        while True:
            try:
                batch = next(batches, None)
            except InvalidDataError:
                await self.save()
                raise
            except Exception as exc:
                await self.save()
                raise DataSourceError(
                    f"the training data raised at epoch {self.position.epoch + 1}, batch "
                    f"{self.position.batch}: {exc!r}; the checkpoint holds the {self.position.step} "
                    "steps before it"
                ) from exc
            if batch is None:
                break
            t0 = time.perf_counter()
            stats = await self.step(batch)
            if stats is None:
                return False
            tally.seconds += time.perf_counter() - t0
            tally.loss_sum += stats.loss * stats.samples
            tally.samples += stats.samples
            self.position.batch += 1
            self.position.step += int(stats.applied)
            for cb in self.callbacks:
                cb.on_step(self.position, stats, tally.mean_loss, tally.rate)
            if self.reached_max_steps():
                return False
            if self.stop.requested and self.agree_to_stop is None:
                return False
        await self.finish_epoch(tally)
        return True

    async def step(self, batch: tuple[Any, Any]) -> StepStats | None:
        """One `Step`; None when the trainer is at its own step limit.

        Raises:
            InvalidBatchError, NonFiniteError: the trainer refused the batch
                (nothing of it was applied); the checkpoint is saved first.
        """
        try:
            stats: StepStats = await self.trainer.ask(Step(*batch), timeout=self.timeout)
        except StepLimitError:
            # a trainer that counts its own updates (a parameter server: one per
            # worker's push) can reach max_steps before fit's count of Steps does
            self.refused = True
            return None
        except (InvalidBatchError, NonFiniteError) as exc:
            await self.save()
            p = self.position
            exc.add_note(
                f"the trainer refused epoch {p.epoch + 1}, batch {p.batch} of the training "
                "data; nothing of that batch was applied"
                + (
                    f"; the checkpoint holds the {p.step} steps before it"
                    if self.checkpoint
                    else ""
                )
            )
            raise
        return stats

    async def probe_validation(self) -> None:
        """Evaluate the validation set's first batch before any step (as
        Lightning's sanity check does): a set the trainer refuses fails
        before training, not after the first epoch."""
        if self.validation is not None:
            await self.evaluate_source("validation", self.validation, first_only=True)

    def heard(self, split: str, loss: float, accuracy: float) -> None:
        for cb in self.callbacks:
            cb.on_evaluate(split, loss, accuracy, FitPosition(**vars(self.position)))

    async def evaluate_source(
        self, split: str, source: BatchSource, *, first_only: bool = False
    ) -> tuple[float, float]:
        """Loss and accuracy over a whole data set (or its first batch): one
        request for arrays, else batch by batch, weighted by their sizes.

        Raises:
            InvalidBatchError: the trainer refused it (a note names `split`).
        """
        try:
            if source.arrays is not None and not first_only:
                return await self.evaluate(*source.arrays)
            loss = correct = 0.0
            samples = 0
            for x, y in _in_order(source, self.batch_size):
                batch_loss, batch_acc = await self.evaluate(x, y)
                loss += batch_loss * len(y)
                correct += batch_acc * len(y)
                samples += len(y)
                if first_only:
                    break
        except InvalidBatchError as exc:
            exc.add_note(f"in the {split} set (epoch {self.position.epoch + 1})")
            raise
        if samples == 0:
            return math.nan, math.nan
        return loss / samples, correct / samples

    async def finish_epoch(self, tally: _Tally) -> None:
        train_loss, train_acc = await self.evaluate_source("train", self.train)
        self.heard("train", train_loss, train_acc)
        test_loss, test_acc = math.nan, math.nan
        if self.validation is not None:
            test_loss, test_acc = await self.evaluate_source("validation", self.validation)
            self.heard("validation", test_loss, test_acc)
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
            if self.reached_max_steps():
                return "reached max_steps"
            for cb in self.callbacks:
                cb.on_epoch_start(self.position.epoch + 1, self.epochs)
            if not await self.train_epoch():
                return "reached max_steps" if self.reached_max_steps() else "interrupted"
            if self.position.epoch >= self.epochs:
                break
            if await self.stop_now():
                return "interrupted"
            await self.save()
        return "finished"


async def _max_steps(trainer: ActorRef, timeout: float | None) -> int | None:
    """The trainer's `TrainerConfig.max_steps` (None for a trainer of one's
    own that does not answer `GetTrainingState`)."""
    try:
        state = await trainer.ask(GetTrainingState(), timeout=timeout)
    except TypeError:
        return None
    return state.max_steps if isinstance(state, TrainingState) else None


def _in_order(source: BatchSource, batch_size: int) -> Any:
    """A data set's batches for evaluation: its own order, or epoch 0's."""
    in_order = getattr(source, "in_order", None)
    return in_order(batch_size) if in_order is not None else source.batches(0, 0)


def _asking_evaluator(trainer: ActorRef, timeout: float | None) -> Evaluator:
    async def evaluate(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        result: EvalResult = await trainer.ask(Evaluate(x, y), timeout=timeout)
        return float(result.loss), float(result.accuracy)

    return evaluate


async def fit(
    trainer: ActorRef,
    train: Any,
    *,
    epochs: int,
    batch_size: int,
    seed: int = 0,
    validation: Any = None,
    drop_last: bool = False,
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
        train: `(features, labels)` arrays of equal length, a map-style
            dataset, an iterable of `(features, labels)` batches, or a
            callable `epoch -> iterable` (`atomr.train.core.sources`).
        epochs: total epochs, counting those before `start`.
        batch_size: samples per `Step` (arrays and datasets; an iterable's
            batches are taken as they come).
        seed: the shuffle seed of arrays and datasets (epoch `e` uses
            `default_rng([seed, e])`).
        validation: evaluated after every epoch (the same kinds as `train`),
            or None.
        drop_last: drop the last batch of an epoch when it is smaller than
            `batch_size` (arrays and datasets).
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
        TypeError, ValueError: bad arguments (checked before any step), or
            a dataset or batch of the wrong length or shape.
        DataSourceError: the training data raised part way through an
            epoch; the checkpoint (if any) was saved at the position reached.
        InvalidBatchError, NonFiniteError: the trainer refused a training
            batch (nothing of it applied; the checkpoint, if any, was saved
            at it, and a note says which), or a validation or training set
            at evaluation (the validation set's first batch is evaluated
            before any step, so a set of the wrong shape fails at once).
        Exception: whatever the trainer answered a request with (a
            `NonFiniteError`, an `AskTimeoutError`, ...).
    """
    _positive_int("epochs", epochs)
    _positive_int("seed", seed, minimum=0)
    _positive_int("batch_size", batch_size)
    source = as_source(
        "train", train, batch_size=batch_size, seed=seed, min_batch_size=min_batch_size,
        drop_last=drop_last,
    )  # fmt: skip
    val = None
    if validation is not None:
        val = as_source("validation", validation, batch_size=batch_size, seed=seed)
    position = FitPosition(**vars(start)) if start is not None else FitPosition()
    if position.epoch >= epochs:
        raise ValueError(f"start is at epoch {position.epoch}: pass epochs > {position.epoch}")
    count = source.count()
    if count is not None and position.batch >= count:
        raise ValueError(f"start.batch {position.batch} is past the epoch's {count} batches")
    run = _Run(
        trainer=trainer,
        train=source,
        validation=val,
        epochs=epochs,
        batch_size=batch_size,
        position=position,
        callbacks=list(callbacks),
        stop=stop if stop is not None else StopFlag(),
        agree_to_stop=agree_to_stop,
        evaluate=evaluate if evaluate is not None else _asking_evaluator(trainer, timeout),
        checkpoint=Path(checkpoint) if checkpoint is not None else None,
        timeout=timeout,
    )
    run.max_steps = await _max_steps(trainer, timeout)
    await run.probe_validation()
    status = await run.loop()
    await run.save()
    return FitResult(status, position, run.records)
