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
`fit` raises `DataSourceError`; a callback that raises ends the run the same
way, with its own exception, after the other callbacks have heard the rest of
the step or epoch in flight (`FitCallback` says what each hears). In a job
(`agree_to_stop`) such a failure saves nothing: a save takes every process,
and the failure is one process's alone; the error says so.

With `checkpoint=path`, the trainer saves after every epoch, at the end and
when the run is stopped; `FitCallback.on_checkpoint` hears of each save with
the position to resume from.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from atomr._arguments import int_at_least
from atomr.actor import ActorRef
from atomr.actor.ref import check_timeout
from atomr.train._fit_callbacks import Callbacks, check_callable_hooks
from atomr.train._fit_evaluation import measure
from atomr.train._fit_run import FitRun
from atomr.train.core.checkpoint import check_save_location
from atomr.train.core.data import epoch_order
from atomr.train.core.messages import GetTrainingState
from atomr.train.core.sources import DataSourceError, as_source, batch_bounds
from atomr.train.core.stats import TrainingState
from atomr.train.fit_events import (
    EpochRecord,
    Evaluator,
    FitCallback,
    FitPosition,
    FitResult,
    StopFlag,
)

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


def _check_hooks(callbacks: Any, stop: Any, agree_to_stop: Any, evaluate: Any) -> None:
    """Raises TypeError unless `callbacks` is a sequence of `FitCallback`s
    whose hooks take fit's arguments, `stop` a `StopFlag` or None, and
    `agree_to_stop` and `evaluate` callables or None (else a step would be
    applied before the first use failed)."""
    if not isinstance(callbacks, Sequence) or isinstance(callbacks, str | bytes):
        raise TypeError(
            f"callbacks must be a sequence of FitCallback, got {type(callbacks).__name__}"
        )
    for cb in callbacks:
        if not isinstance(cb, FitCallback):
            raise TypeError(f"callbacks must be FitCallback instances, got {type(cb).__name__}")
    check_callable_hooks(callbacks)
    if stop is not None and not isinstance(stop, StopFlag):
        raise TypeError(f"stop must be a StopFlag or None, got {type(stop).__name__}")
    for name, hook in (("agree_to_stop", agree_to_stop), ("evaluate", evaluate)):
        if hook is not None and not callable(hook):
            raise TypeError(f"{name} must be callable or None, got {type(hook).__name__}")


def _check_trainer(trainer: object) -> None:
    """Raises: TypeError: `trainer` is not an `ActorRef` (an un-awaited
    `X.spawn(...)` or a trainer class, say), before anything is asked."""
    if isinstance(trainer, ActorRef):
        return
    if inspect.isawaitable(trainer):
        got = f"an un-awaited {type(trainer).__name__}: write `ref = await X.spawn(...)`"
    elif isinstance(trainer, type):
        got = f"the class {trainer.__name__}: spawn it first, `ref = await X.spawn(...)`"
    else:
        got = type(trainer).__name__
    raise TypeError(f"trainer must be the ActorRef a trainer's spawn returns, got {got}")


_FITTING: set[ActorRef] = set()
"""The trainers a `fit` is training now: a second one would interleave its
steps with the first's, and both positions would be wrong."""


def _start_position(start: Any, epochs: int, count: int | None) -> FitPosition:
    """A copy of `start` (None: the beginning), checked against the run.

    Raises:
        TypeError: not a `FitPosition`, or a field that is not an int.
        ValueError: a negative field, an epoch at or past `epochs`, or a
            batch past the epoch's `count` batches.
    """
    if start is None:
        return FitPosition()
    if not isinstance(start, FitPosition):
        raise TypeError(f"start must be a FitPosition, got {type(start).__name__}")
    for name in ("epoch", "batch", "step"):
        int_at_least(f"start.{name}", getattr(start, name), 0)
    if start.epoch >= epochs:
        raise ValueError(f"start is at epoch {start.epoch}: pass epochs > {start.epoch}")
    if count is not None and start.batch >= count:
        raise ValueError(f"start.batch {start.batch} is past the epoch's {count} batches")
    return FitPosition(start.epoch, start.batch, start.step)


async def _training_state(trainer: ActorRef, timeout: float | None) -> TrainingState | None:
    """The trainer's `TrainingState` (None for a trainer of one's own that
    does not answer `GetTrainingState`)."""
    try:
        state = await trainer.ask(GetTrainingState(), timeout=timeout)
    except TypeError:
        return None
    return state if isinstance(state, TrainingState) else None


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
            `batch_size`; only for arrays and datasets (an iterable's or a
            callable's batches are taken as they come: a ValueError).
        start: the position to resume from (the trainer already holds the
            checkpoint's state); None starts at the beginning. Its `epoch`
            and `batch` say where in the data; the step count is the
            trainer's own (`GetTrainingState`, as a checkpoint restores it),
            whatever `start.step` says: `start.step` is used only for a
            trainer that does not answer `GetTrainingState`.
        checkpoint: save here after every epoch, at the end and on a stop.
        callbacks: `FitCallback`s, called in order.
        stop: checked before the first step and after every step; once
            requested, the run saves its checkpoint and returns "interrupted".
        agree_to_stop: for the processes of a job: an async function called
            before the first step and at every epoch's end but the last (the
            run ends there anyway) with this process's request, returning
            whether all stop (True or False: anything else, such as 'no', is
            a TypeError, before any step, not taken by its truth); with it,
            `stop` is only honoured there.
        evaluate: an async function `(features, labels) -> (loss, accuracy)`
            (anything else is a TypeError naming it, before any step: it is
            first called on the validation set's first batch, or without
            one the training set's); default: ask the trainer to
            `Evaluate`. Arrays are evaluated in one call, a dataset
            or iterable batch by batch: the batches' accuracies weighted by
            their label counts (`labels.size`: rows, tokens), their losses by
            their normalisers (`EvalResult.normaliser`). A hook gives none,
            so its losses are weighted by the label count too: exact for a
            mean over labels, not for a loss with class weights.
        min_batch_size: a tail batch smaller than this is dropped (a
            data-parallel trainer needs one sample per replica).
        timeout: seconds each ask to the trainer may take (None: no limit).

    Returns:
        The `FitResult`: status, final position, the epochs' records.

    Raises:
        TypeError, ValueError: bad arguments (checked before any step:
            `trainer` not an `ActorRef` (an un-awaited `spawn`, say), a
            count that is not an int >= 1 (`seed`: >= 0; a bool is no
            int), a callback hook that cannot take the arguments `fit`
            passes it or is an async function (never awaited), a `start` that does not fit, `drop_last` not a bool, or
            True for an iterable or a callable), or a dataset or batch of the
            wrong length or shape; TypeError also for an `evaluate` or
            `agree_to_stop` hook that is no async function or returns the
            wrong thing (before any step); TypeError for a trainer that
            answers `Step` with anything but a `StepStats`, or `Evaluate`
            with anything but an `EvalResult` (None, say).
        FileNotFoundError, CheckpointError, OSError: a `checkpoint` whose
            folder is missing, that is not a regular file, or whose folder a
            test write fails in (no permission, read-only), before any step.
        RuntimeError: another `fit` is training `trainer` now.
        DataSourceError: the training data raised part way through an
            epoch; the checkpoint (if any) was saved at the position reached.
            In a job (`agree_to_stop`) no failure below saves the checkpoint
            (a save takes every process); a note on the error says so.
        Exception: what a callback raised first (a metrics log's `OSError`
            on a full disk, say), once the others have heard the rest of the
            step, or of the epoch on its last batch; the checkpoint (if any)
            was saved at the position reached first, and a note names the
            callback and says what the checkpoint holds (`FitCallback`).
        InvalidBatchError, NonFiniteError: the trainer refused a training
            batch (nothing of it applied; the checkpoint, if any, was saved
            at it, and a note says which), or a validation or training set
            at evaluation (the validation set's first batch is evaluated
            before any step, so a set of the wrong shape fails at once).
        Exception: whatever the trainer answered a request with (a
            `NonFiniteError`, an `AskTimeoutError`, ...).
    """
    int_at_least("epochs", epochs)
    int_at_least("seed", seed, 0, high=None)
    int_at_least("batch_size", batch_size)
    int_at_least("min_batch_size", min_batch_size)
    _check_hooks(callbacks, stop, agree_to_stop, evaluate)
    _check_trainer(trainer)
    check_timeout(timeout)
    if checkpoint is not None:
        check_save_location(checkpoint)  # not after the first epoch's training
    source = as_source(
        "train", train, batch_size=batch_size, seed=seed, min_batch_size=min_batch_size,
        drop_last=drop_last,
    )  # fmt: skip
    val = None
    if validation is not None:
        val = as_source("validation", validation, batch_size=batch_size, seed=seed)
    position = _start_position(start, epochs, source.count())
    run = FitRun(
        trainer=trainer,
        train=source,
        validation=val,
        epochs=epochs,
        batch_size=batch_size,
        position=position,
        callbacks=Callbacks(callbacks),
        stop=stop if stop is not None else StopFlag(),
        agree_to_stop=agree_to_stop,
        evaluate=measure(trainer, evaluate, timeout),
        checkpoint=Path(checkpoint) if checkpoint is not None else None,
        timeout=timeout,
    )
    if trainer in _FITTING:
        raise RuntimeError("fit is already training this trainer: one fit per trainer at a time")
    _FITTING.add(trainer)
    try:
        state = await _training_state(trainer, timeout)
        if state is not None:  # its own count is the run's, whatever start.step says
            run.max_steps, run.rounds, position.step = state.max_steps, state.rounds, state.step
        await run.probe_evaluation(hook=evaluate is not None)
        status = await run.loop()
        await run.save()
        run.callbacks.raise_first()
    except Exception as exc:
        await run.after_error(exc)
        raise
    finally:
        _FITTING.discard(trainer)
    return FitResult(status, position, run.records)
