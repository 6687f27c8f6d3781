"""`fit` in a job (`agree_to_stop`): a save takes every process, so a
failure that one process alone sees (its data, its evaluation, a batch its
trainer refuses, a callback) saves nothing there; the error says so. A save
started by one process alone waited for the others until the collective's
timeout."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atomr import ActorSystem
from atomr.train import LossKind, Mlp, OptimizerKind, Trainer, TrainerConfig
from atomr.train.core import synthetic_classification
from atomr.train.core.errors import InvalidBatchError
from atomr.train.fit import DataSourceError, FitCallback, FitPosition, fit
from tests.train.mpi_scripts.harness import run_script

CONFIG = TrainerConfig(OptimizerKind.adam(0.01), LossKind.CROSS_ENTROPY)
X, Y = synthetic_classification(40, 6, 3, seed=1)  # batch 8: five batches an epoch
BATCHES = [(X[k : k + 8], Y[k : k + 8]) for k in range(0, 40, 8)]


async def _agree(requested: bool) -> bool:
    """One process's `agree_to_stop`: the job is this process alone, but
    `fit` runs as in a job of many."""
    return requested


def _data_fails(epoch: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    yield from BATCHES[:2]
    raise OSError("the network share went away")


def _bad_label() -> list[tuple[np.ndarray, np.ndarray]]:
    labels = BATCHES[2][1].copy()
    labels[0] = 99  # out of range: the trainer refuses the batch
    return [*BATCHES[:2], (BATCHES[2][0], labels), *BATCHES[3:]]


class _Validation:
    """A validation dataset whose reads fail after the first (fit's probe)."""

    def __init__(self) -> None:
        self.reads = 0

    def __len__(self) -> int:
        return 8

    def get_batch(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self.reads += 1
        if self.reads > 2:  # 1 and 2: the source's and fit's probes
            raise OSError("the validation share went away")
        return X[idx], Y[idx]


class _Heard(FitCallback):
    """Hears the saves; raises at step `fail_at` (0: never)."""

    def __init__(self, fail_at: int = 0) -> None:
        self.fail_at, self.saved = fail_at, []  # type: ignore[var-annotated]

    def on_step(self, position: FitPosition, *_: Any) -> None:
        if position.step == self.fail_at:
            raise OSError(28, "No space left on device")

    def on_checkpoint(self, path: Path, position: FitPosition) -> None:
        self.saved.append(position)


@pytest.mark.parametrize(
    ("failure", "error", "what"),
    [
        ("data", DataSourceError, "the run stopped at it"),
        (
            "batch",
            InvalidBatchError,
            "batch 2 of the training data; nothing of that batch was applied",
        ),
        ("evaluation", OSError, "evaluating after epoch 1 failed; its training is kept"),
        ("callback", OSError, "the callback _Heard.on_step raised after step 3; the run stopped"),
    ],
)
async def test_a_failure_of_one_process_in_a_job_saves_nothing(
    failure: str, error: type[Exception], what: str, tmp_path: Path
) -> None:
    ckpt = tmp_path / "c.ckpt"
    heard = _Heard(fail_at=3 if failure == "callback" else 0)
    train: Any = {"data": _data_fails, "batch": _bad_label()}.get(failure, BATCHES)
    validation = _Validation() if failure == "evaluation" else None
    async with ActorSystem("fit-job") as system:
        trainer = await Trainer.spawn(system, Mlp([6, 8, 3], seed=0), "cpu:0", CONFIG)
        with pytest.raises(error) as caught:
            await fit(
                trainer, train, validation=validation, epochs=2, batch_size=8,
                checkpoint=ckpt, callbacks=[heard], agree_to_stop=_agree,
            )  # fmt: skip
    assert heard.saved == []
    assert not ckpt.exists()
    note = "".join(caught.value.__notes__)
    assert f"{what}; the checkpoint was not saved (a job's processes save together)" in note


@pytest.mark.mpi
def test_a_ranks_data_failure_saves_nothing_under_mpiexec(tmp_path: Path) -> None:
    """Two ranks of a sharded trainer: rank 1's data raises, rank 0's does
    not. Rank 1 saved alone before: its save's collectives met rank 0's
    step's, and its note said "the checkpoint holds the 2 steps trained" of
    a checkpoint never written (or, where they do not meet, it waited until
    the collective's timeout: "saving the checkpoint failed too"); the
    operation check now refuses such a meeting (`CollectiveMismatchError`
    on both ranks: `comm/mpi/test_order_check.py`)."""
    result, _ = run_script(2, "fit_rank_failure.py", tmp_path, 30.0, timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == 3, output
    assert "[rank 1] DataSourceError(" in output, output
    assert "the checkpoint was not saved (a job's processes save together)" in output, output
    assert "saving the checkpoint failed too" not in output
    assert not (tmp_path / "fit.ckpt").exists()
