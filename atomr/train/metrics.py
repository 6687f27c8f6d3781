"""Metrics logs for `fit`: JSON Lines, and TensorBoard event files.

Both are `FitCallback`s: pass them in `fit(..., callbacks=[...])` (`atomr
train` does with `--metrics PATH` and `--tensorboard DIR`). Each step logs
its loss, gradient norm, samples, the epoch's throughput so far (samples/s,
wall time of the steps) and the share of the step spent reducing gradients
across workers (`StepStats.comm_micros / step_micros`: the data-parallel
all-reduce; 0 on one device); each evaluation its loss and accuracy; each
epoch its `EpochRecord`.

TensorBoard files are written through `tensorboardX` (the `atomr[tensorboard]`
extra), so `tensorboard --logdir DIR` shows the curves.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import IO, Any

from atomr.train.core.stats import StepStats
from atomr.train.fit import EpochRecord, FitCallback, FitPosition

__all__ = ["JsonLinesLog", "TensorBoardLog", "step_metrics"]


def step_metrics(stats: StepStats, rate: float) -> dict[str, float]:
    """The figures of one step: loss, gradient norm, samples, samples/s (the
    epoch's so far) and the gradient-reduction share of the step's time."""
    share = stats.comm_micros / stats.step_micros if stats.step_micros > 0 else 0.0
    return {
        "loss": stats.loss,
        "grad_norm": stats.grad_norm,
        "samples": float(stats.samples),
        "samples_per_s": rate,
        "allreduce_share": share,
    }


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None  # JSON has no NaN


class JsonLinesLog(FitCallback):
    """One JSON object per line: `{"event": "step" | "evaluate" | "epoch", ...}`.

    A `step` event holds the `FitPosition` after it (`epoch`: the 0-based
    epoch in progress), its figures and `applied` (False for an
    accumulation window's micro-steps); `evaluate` and `epoch` events hold
    the 1-based number of the epoch just finished.

    Args:
        path: the file (appended to; its folder is made).

    Raises:
        OSError: the file cannot be opened (when made).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] | None = open(self.path, "a", encoding="utf-8")  # noqa: SIM115

    def _write(self, record: dict[str, Any]) -> None:
        if self._file is None:
            raise ValueError(f"{self.path}: the log is closed")
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def on_step(
        self, position: FitPosition, stats: StepStats, mean_loss: float, rate: float
    ) -> None:
        """Log the step (see `step_metrics`)."""
        figures = step_metrics(stats, rate)
        self._write({"event": "step", **vars(position), **figures, "applied": stats.applied})

    def on_evaluate(self, split: str, loss: float, accuracy: float, position: FitPosition) -> None:
        """Log an evaluation (`epoch`: the 1-based number of the epoch just
        finished, as in its `epoch` event)."""
        self._write(
            {
                "event": "evaluate",
                "split": split,
                "step": position.step,
                "epoch": position.epoch + 1,
                "loss": _finite_or_none(loss),
                "accuracy": _finite_or_none(accuracy),
            }
        )

    def on_epoch_end(self, record: EpochRecord, epochs: int) -> None:
        """Log the epoch's record."""
        figures = {k: _finite_or_none(v) for k, v in vars(record).items() if isinstance(v, float)}
        self._write({"event": "epoch", "epoch": record.epoch, "step": record.step, **figures})

    def close(self) -> None:
        """Close the file (later events raise ValueError)."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> JsonLinesLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TensorBoardLog(FitCallback):
    """TensorBoard scalars: `step/*` at every step, `<split>/loss` and
    `<split>/accuracy` at every evaluation, `epoch/*` at every epoch end,
    indexed by the optimizer step.

    Args:
        logdir: the folder of the event files.

    Raises:
        ImportError: tensorboardX is not installed (`pip install 'atomr[tensorboard]'`).
    """

    def __init__(self, logdir: str | Path) -> None:
        try:
            from tensorboardX import SummaryWriter
        except ImportError as exc:
            raise ImportError(
                f"TensorBoard logs need tensorboardX: pip install 'atomr[tensorboard]' ({exc})"
            ) from exc
        self.logdir = Path(logdir)
        self._writer: Any = SummaryWriter(logdir=str(self.logdir))

    def on_step(
        self, position: FitPosition, stats: StepStats, mean_loss: float, rate: float
    ) -> None:
        """Log the step's figures (see `step_metrics`), one point per optimizer
        step: an accumulation window's micro-steps that applied nothing are
        left out (their loss is in the window's last step, and they have no
        gradient norm)."""
        if not stats.applied:
            return
        for name, value in step_metrics(stats, rate).items():
            self._writer.add_scalar(f"step/{name}", value, position.step)

    def on_evaluate(self, split: str, loss: float, accuracy: float, position: FitPosition) -> None:
        """Log an evaluation's loss and accuracy (NaN ones are skipped)."""
        for name, value in (("loss", loss), ("accuracy", accuracy)):
            if math.isfinite(value):
                self._writer.add_scalar(f"{split}/{name}", value, position.step)

    def on_epoch_end(self, record: EpochRecord, epochs: int) -> None:
        """Log the epoch's record."""
        for name, value in vars(record).items():
            if isinstance(value, float) and math.isfinite(value):
                self._writer.add_scalar(f"epoch/{name}", value, record.step)
        self._writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        self._writer.close()

    def __enter__(self) -> TensorBoardLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
