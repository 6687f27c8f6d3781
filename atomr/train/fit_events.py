"""What `fit` reports: its position, epoch records, result, stop flag and
the `FitCallback` hooks (`fit.py` is the loop itself)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from atomr.train.core.stats import StepStats

__all__ = ["EpochRecord", "Evaluator", "FitCallback", "FitPosition", "FitResult", "StopFlag"]

Evaluator = Callable[[np.ndarray, np.ndarray], Awaitable[tuple[float, float]]]
"""`(features, labels) -> (loss, accuracy)`; the default asks the trainer to
`Evaluate`. Evaluating a set batch by batch, `fit` weights a hook's losses and
accuracies by the batches' label counts (`fit`'s `evaluate` argument)."""


@dataclass
class FitPosition:
    """Where training stands.

    Attributes:
        epoch: 0-based epoch in progress (or next to start).
        batch: next batch of that epoch.
        step: optimizer steps applied so far (all runs; `fit` takes the
            trainer's own count, `TrainingState.step`).
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
        train_loss: mean loss of this epoch's steps, each weighted by its
            samples (an accumulation window's mean by the window's).
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
        status: "finished"; "interrupted" when a stop was requested; "reached
            max_steps" when the trainer's `TrainerConfig.max_steps` was reached
            (its `GetTrainingState` says so).
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
    """Hooks `fit` calls; override the ones you need (each does nothing here)
    with plain functions: `fit` does not await a hook, and refuses an async
    one (a TypeError before any step; at its call for a callable object).

    A callback that raises ends the run with that exception, without
    keeping the others from hearing what they must (a history, a save):

    - the other callbacks still hear that event, and every event up to the
      end of the step in flight (on an epoch's last batch, up to the end of
      the epoch: its evaluations and `on_epoch_end`, as for a stop); the
      callback that raised hears nothing more of the run;
    - the checkpoint (if any) is then saved at the position reached, and
      the other callbacks hear `on_checkpoint` (after a failure in
      `on_checkpoint`, the save just made stands);
    - `fit` raises the first callback's exception, with a note naming it
      and saying what the checkpoint holds; any other callback that raised
      meanwhile is named in a note too.
    """

    def on_epoch_start(self, epoch: int, epochs: int) -> None:
        """Epoch `epoch` (1-based) of `epochs` starts."""

    def on_step(
        self, position: FitPosition, stats: StepStats, mean_loss: float, rate: float
    ) -> None:
        """A step finished; `position` is where the run stands after it (a
        copy of its own: keep it, or change it, without moving the run);
        `mean_loss` and `rate` (samples/s) are the epoch's so far."""

    def on_evaluate(self, split: str, loss: float, accuracy: float, position: FitPosition) -> None:
        """After an epoch, `split` ("train" or "validation") was evaluated."""

    def on_epoch_end(self, record: EpochRecord, epochs: int) -> None:
        """An epoch finished and was evaluated."""

    def on_checkpoint(self, path: Path, position: FitPosition) -> None:
        """The trainer saved a checkpoint at `path`; resume it from `position`."""
