"""`Progress`: the tqdm progress bar of a training run (loss, accuracy, samples/s)."""

from __future__ import annotations

import math
import sys
from typing import Any

from atomr.train.core.stats import StepStats
from atomr.train.fit import EpochRecord, FitCallback, FitPosition

__all__ = ["Progress"]


class Progress(FitCallback):
    """A progress bar over all remaining steps of a run, on stderr.

    The postfix shows the running mean loss of the current epoch, the test
    accuracy of the last finished epoch (from the end of the first epoch on)
    and the current epoch's throughput.
    With `enabled=False` (`--quiet`) it prints nothing.

    Args:
        total_steps: steps of the whole run (all epochs).
        done_steps: steps already done (a resumed run starts part way).
        enabled: False to stay silent.
    """

    def __init__(self, total_steps: int, done_steps: int = 0, enabled: bool = True) -> None:
        self._bar: Any = None
        self._accuracy = float("nan")
        self._postfix: dict[str, str] = {}
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:  # tqdm is in the [train] extra; fall back to epoch lines
                tqdm = None
            if tqdm is not None:
                self._bar = tqdm(
                    total=total_steps,
                    initial=done_steps,
                    unit="step",
                    file=sys.stderr,
                    dynamic_ncols=True,
                    leave=True,
                )
        self._enabled = enabled

    def on_epoch_start(self, epoch: int, epochs: int) -> None:
        """Show which epoch (1-based) of how many is running."""
        if self._bar is not None:
            self._bar.set_description(f"epoch {epoch}/{epochs}")

    def set_accuracy(self, accuracy: float) -> None:
        """Show this test accuracy until the next epoch ends (a resumed run's last)."""
        self._accuracy = accuracy

    def on_step(
        self, position: FitPosition, stats: StepStats, mean_loss: float, samples_per_s: float
    ) -> None:
        """Advance by one step.

        Args:
            position: where training stands (unused: the bar counts steps).
            stats: the step's statistics.
            mean_loss: the running mean loss of the current epoch.
            samples_per_s: the current epoch's throughput so far.
        """
        if self._bar is None:
            return
        postfix = {"loss": f"{mean_loss:.4f}"}
        if not math.isnan(self._accuracy):  # NaN until the first epoch has ended
            postfix["acc"] = f"{self._accuracy:.3f}"
        postfix["samples_s"] = f"{samples_per_s:,.0f}"
        self._postfix = postfix
        self._bar.set_postfix(postfix, refresh=False)
        self._bar.update(1)

    def on_epoch_end(self, record: EpochRecord, epochs: int) -> None:
        """Record a finished epoch (the bar shows its test accuracy from now on)."""
        self._accuracy = record.test_accuracy
        line = (
            f"epoch {record.epoch}/{epochs}: train loss {record.train_loss:.4f}, "
            f"test loss {record.test_loss:.4f}, test accuracy {record.test_accuracy:.4f}, "
            f"{record.samples_per_s:,.0f} samples/s"
        )
        if self._bar is not None:
            self._bar.write(line, file=sys.stderr)
            if self._postfix:  # the last epoch's bar must not keep the one before's acc
                rest = {k: v for k, v in self._postfix.items() if k not in ("loss", "acc")}
                loss = self._postfix["loss"]
                self._postfix = {"loss": loss, "acc": f"{self._accuracy:.3f}", **rest}
                self._bar.set_postfix(self._postfix)
        elif self._enabled:
            print(line, file=sys.stderr, flush=True)

    def close(self) -> None:
        """Close the bar (idempotent)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
