"""`FitRun`: the state of one `fit` call and its epoch loop (`fit.py`
checks the arguments and builds it)."""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atomr._arguments import bool_flag
from atomr.actor import ActorRef, AskTimeoutError
from atomr.train._fit_callbacks import CallbackFailure, Callbacks, awaited
from atomr.train._fit_evaluation import Measure, contract_reply, evaluate_set
from atomr.train.core.errors import InvalidBatchError, NonFiniteError, StepLimitError
from atomr.train.core.messages import CloseRound, SaveCheckpoint, Step
from atomr.train.core.sources import BatchSource, DataSourceError, InvalidDataError
from atomr.train.core.stats import StepStats
from atomr.train.fit_events import EpochRecord, FitPosition, StopFlag

__all__ = ["FitRun"]


@dataclass
class _Tally:
    """An epoch's loss sum (step losses times samples), samples, seconds. An
    accumulation window's micro-steps count as they come, then the applying
    step's loss (the window's mean) replaces them, times the window's
    samples: its own `samples` are its micro-batch's alone (`StepStats`)."""

    loss_sum: float = 0.0
    samples: int = 0
    seconds: float = 0.0
    window_loss: float = 0.0  # the open window's micro-steps in this epoch
    window_samples: int = 0

    def add(self, stats: StepStats) -> None:
        """Count a step's loss and samples."""
        self.samples += stats.samples
        if not stats.applied:
            self.loss_sum += stats.loss * stats.samples
            self.window_loss += stats.loss * stats.samples
            self.window_samples += stats.samples
            return
        self.loss_sum += stats.loss * (self.window_samples + stats.samples) - self.window_loss
        self.window_loss, self.window_samples = 0.0, 0

    @property
    def mean_loss(self) -> float:
        return self.loss_sum / self.samples if self.samples else math.nan

    @property
    def rate(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0


def _exhausted(batches: Iterator[Any]) -> bool:
    """Whether a streamed epoch has no batch left. A batch peeked is dropped
    (a resume reads it again); a source that raises counts as not done."""
    try:
        return next(batches, None) is None
    except Exception:
        return False


@dataclass
class FitRun:
    """One `fit` call's state and settings, and its epoch loop."""

    trainer: ActorRef
    train: BatchSource
    validation: BatchSource | None
    epochs: int
    batch_size: int
    position: FitPosition
    callbacks: Callbacks
    stop: StopFlag
    agree_to_stop: Callable[[bool], Awaitable[bool]] | None
    evaluate: Measure
    checkpoint: Path | None
    timeout: float | None
    max_steps: int | None = None
    records: list[EpochRecord] = field(default_factory=list)
    refused: bool = False  # the trainer refused a Step at its own limit
    rounds: bool = False  # its Steps answer before their batch is applied (TrainingState)

    def reached_max_steps(self) -> bool:
        if self.refused:
            return True
        return self.max_steps is not None and self.position.step >= self.max_steps

    async def save(self) -> None:
        if self.checkpoint is None:
            return
        await self.trainer.ask(SaveCheckpoint(str(self.checkpoint)), timeout=self.timeout)
        self.tell("on_checkpoint", self.checkpoint, self.position)

    def tell(self, hook: str, *args: Any) -> None:
        """Call the callbacks' `hook` with `args` (`Callbacks.tell`: each gets
        a position of its own; one that raises is kept, and the run stops at
        the next point that resumes)."""
        self.callbacks.tell(hook, self.position.step, *args)

    def held(self) -> str:
        """What the checkpoint holds, for a note ("" without a checkpoint)."""
        p = self.position
        if self.checkpoint is None:
            return ""
        return (
            f"; the checkpoint holds the {p.step} steps trained, to resume at epoch "
            f"{p.epoch + 1}, batch {p.batch}"
        )

    async def save_reached(self, error: BaseException, what: str) -> None:
        """`what` ended the run with `error`: save the checkpoint where the
        run stands, and note on `error` what happened and what the
        checkpoint holds (or that saving failed too: `error` is still the
        one to raise). In a job (`agree_to_stop`) nothing is saved, and the
        note says so: a save takes every process, and a failure is this
        process's alone (the others train on, and would not join the save)."""
        if self.agree_to_stop is not None:
            error.add_note(
                f"{what}; the checkpoint was not saved (a job's processes save together)"
            )
            return
        try:
            await self.save()
        except Exception as failed:
            error.add_note(f"{what}; saving the checkpoint failed too: {failed!r}")
            return
        error.add_note(what + self.held())

    async def after_error(self, error: BaseException) -> None:
        """`fit` ends the run with `error`. If it is the first callback
        failure (`Callbacks.raise_first`): save the checkpoint where the run
        stands (the epoch of the failure is finished already) and note which
        callback it was and what the checkpoint holds; a failure to hear of a
        save is noted without saving again; in a job nothing is saved
        (`save_reached`). Then name on `error` any other callback that raised."""
        first = self.callbacks.first
        if first is not None and first.error is error:
            await self.save_after_callback(first)
        self.callbacks.note_others(error)

    async def save_after_callback(self, failure: CallbackFailure) -> None:
        """Save the checkpoint after `failure` (see `after_error`), and note it."""
        what = f"the callback {failure.hook} raised after step {failure.step}; the run stopped"
        if failure.hook.endswith(".on_checkpoint"):
            failure.error.add_note(what + self.held())
        else:
            await self.save_reached(failure.error, what)

    def next_epoch(self) -> None:
        """Move the position to the next epoch's start."""
        self.position.epoch += 1
        self.position.batch = 0

    def stopping(self) -> bool:
        """Whether the run stops after the step just made: the step limit,
        a callback that raised, or a stop outside a job (a job's processes
        stop together, at an epoch's end)."""
        if self.reached_max_steps() or self.callbacks.first is not None:
            return True
        return self.stop.requested and self.agree_to_stop is None

    async def train_epoch(self) -> bool:
        """The rest of the current epoch's steps, then its evaluation; False
        when stopped part way (`stopping`, or the trainer refused a `Step`
        at its step limit). A stop on the epoch's last batch finishes the
        epoch first (its evaluations and record are told), so that the
        position saved is the next epoch's start; a stop part way closes an
        open round (`close_round`), so that the position counts every batch
        trained.

        Raises:
            DataSourceError: the data raised (after the checkpoint is saved: `save_reached`).
            InvalidDataError: a bad batch, or an epoch without batches.
            Exception: what the trainer answered a `CloseRound` with.
        """
        tally = _Tally()
        batches = self.train.batches(self.position.epoch, self.position.batch)
        count = self.train.count()
        while (batch := await self.next_batch(batches)) is not None:
            t0 = time.perf_counter()
            stats = await self.step(batch)
            if stats is None:
                await self.close_round(tally)
                return False
            self.position.batch += 1
            self.counted(tally, stats, t0)
            if self.stopping():
                if self.position.batch == count or (count is None and _exhausted(batches)):
                    await self.finish_epoch(tally)
                else:
                    await self.close_round(tally)
                return False
        await self.finish_epoch(tally)
        return True

    def counted(self, tally: _Tally, stats: StepStats, started: float) -> None:
        """Count a step (asked at `started`) in the epoch's figures and the
        position, and tell the callbacks."""
        tally.seconds += time.perf_counter() - started
        tally.add(stats)
        self.position.step += stats.updates if stats.applied else 0
        self.tell("on_step", self.position, stats, tally.mean_loss, tally.rate)

    async def close_round(self, tally: _Tally) -> None:
        """At an epoch's end or a stop, close a trainer's open round
        (`CloseRound`), so that the figures include its last batches.

        Raises:
            Exception: what the trainer answered (the round not applied).
        """
        if not self.rounds:
            return
        t0 = time.perf_counter()
        stats: StepStats | None = await self.trainer.ask(CloseRound(), timeout=self.timeout)
        if stats is not None:
            self.counted(tally, stats, t0)

    async def next_batch(self, batches: Iterator[Any]) -> Any:
        """The epoch's next batch, or None at its end.

        Raises:
            InvalidDataError: a bad batch (after the checkpoint is saved: `save_reached`).
            DataSourceError: the data raised (after the checkpoint is saved: `save_reached`).
        """
        try:
            return next(batches, None)
        except InvalidDataError as exc:
            await self.save_reached(exc, "the run stopped at it")
            raise
        except Exception as exc:
            p = self.position
            error = DataSourceError(
                f"the training data raised at epoch {p.epoch + 1}, batch {p.batch}: {exc!r}"
            )
            await self.save_reached(error, "the run stopped at it")
            raise error from exc

    async def step(self, batch: tuple[Any, Any]) -> StepStats | None:
        """One `Step`; None when the trainer is at its own step limit.

        Raises:
            InvalidBatchError, NonFiniteError: the trainer refused the batch
                (nothing of it was applied); the checkpoint is saved first
                (`save_reached`).
            TypeError: the trainer answered no `StepStats` (`contract_reply`).
        """
        try:
            stats = await self.trainer.ask(Step(*batch), timeout=self.timeout)
        except StepLimitError:
            # a trainer that counts its own updates (a parameter server: one per
            # worker's push) can reach max_steps before fit's count of Steps does
            self.refused = True
            return None
        except (InvalidBatchError, NonFiniteError) as exc:
            p = self.position
            await self.save_reached(
                exc,
                f"the trainer refused epoch {p.epoch + 1}, batch {p.batch} of the training "
                "data; nothing of that batch was applied",
            )
            raise
        return contract_reply(stats, StepStats, "Step")

    async def probe_evaluation(self, hook: bool) -> None:
        """Evaluate the validation set's first batch before any step (as
        Lightning's sanity check does): a set the trainer refuses, or an
        `evaluate` hook (`hook`) that is misused, fails before training, not
        after the first epoch. Without a validation set, a hook is tried on
        the training set's first batch.

        Raises:
            InvalidBatchError, NonFiniteError: the trainer refused the batch.
            TypeError: the hook is no async function or returns no
                `(loss, accuracy)`.
        """
        if self.validation is not None:
            await self.evaluate_source("validation", self.validation, first_only=True)
        elif hook:
            await self.evaluate_source("train", self.train, first_only=True)

    def heard(self, split: str, figures: tuple[float, float], at: FitPosition) -> None:
        self.tell("on_evaluate", split, *figures, at)

    async def evaluate_source(
        self, split: str, source: BatchSource, *, first_only: bool = False
    ) -> tuple[float, float]:
        """Loss and accuracy over a whole data set, or its first batch
        (`evaluate_set`).

        Raises:
            InvalidBatchError: the trainer refused it (a note names `split`).
            Exception: as `evaluate_set`.
        """
        try:
            return await evaluate_set(self.evaluate, source, self.batch_size, first_only=first_only)
        except InvalidBatchError as exc:
            exc.add_note(f"in the {split} set (epoch {self.position.epoch + 1})")
            raise

    async def finish_epoch(self, tally: _Tally) -> None:
        """Evaluate, record and close the epoch just trained. The position
        moves to the next epoch before the callbacks hear of the evaluations
        and the record (one that fails then leaves a position to resume at).

        Raises:
            Exception: what the evaluation raised (the epoch's training is
                kept: `keep_trained_epoch`), or what a callback raised.
        """
        await self.close_round(tally)
        try:
            train = await self.evaluate_source("train", self.train)
            test = (math.nan, math.nan)
            if self.validation is not None:
                test = await self.evaluate_source("validation", self.validation)
        except Exception as exc:
            await self.keep_trained_epoch(exc)
            raise
        finished = FitPosition(**vars(self.position))
        record = EpochRecord(
            epoch=finished.epoch + 1,
            step=finished.step,
            train_loss=tally.mean_loss,
            train_accuracy=train[1],
            test_loss=test[0],
            test_accuracy=test[1],
            samples_per_s=tally.rate,
            seconds=tally.seconds,
        )
        self.records.append(record)
        self.next_epoch()
        self.heard("train", train, finished)
        if self.validation is not None:
            self.heard("validation", test, finished)
        self.tell("on_epoch_end", record, self.epochs)

    async def keep_trained_epoch(self, error: Exception) -> None:
        """The evaluation after an epoch failed: its training is kept. The
        position moves to the next epoch (without a record) and the
        checkpoint is saved (not in a job: `save_reached`); `error` gets a
        note saying so."""
        self.next_epoch()
        epoch = self.position.epoch
        if isinstance(error, AskTimeoutError):  # a save would wait as long again
            error.add_note(f"epoch {epoch}'s training was not saved: the trainer did not answer")
            return
        await self.save_reached(
            error, f"evaluating after epoch {epoch} failed; its training is kept"
        )

    async def stop_now(self) -> bool:
        """At the run's start and an epoch's end: whether to stop (every
        process agrees, in a job).

        Raises:
            TypeError: `agree_to_stop` is no async function, or its answer no bool.
        """
        if self.agree_to_stop is not None:
            answer = await awaited("agree_to_stop", self.agree_to_stop(self.stop.requested))
            return bool_flag("agree_to_stop's answer", answer)
        return self.stop.requested

    async def loop(self) -> str:
        """The epochs left; the run's status. Whether to stop is asked
        (`stop_now`) before the first step too: a stop requested already
        ends the run there, and a misused `agree_to_stop` fails before any
        step.

        Raises:
            TypeError: as `stop_now`.
            Exception: what a callback raised first (`Callbacks.raise_first`:
                at the epoch's start, after the step, the epoch or the save
                it raised in), or as `train_epoch`.
        """
        if await self.stop_now():
            return "interrupted"
        while self.position.epoch < self.epochs:
            if self.reached_max_steps():
                return "reached max_steps"
            self.tell("on_epoch_start", self.position.epoch + 1, self.epochs)
            self.callbacks.raise_first()
            trained = await self.train_epoch()
            self.callbacks.raise_first()
            if not trained:
                if self.reached_max_steps():
                    return "reached max_steps"
                return "finished" if self.position.epoch >= self.epochs else "interrupted"
            if self.position.epoch >= self.epochs:
                break
            if await self.stop_now():
                return "interrupted"
            await self.save()
            self.callbacks.raise_first()
        return "finished"
