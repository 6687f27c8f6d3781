"""The contract's messages refuse what no trainer could use when they are
built, and a trainer refuses a learning rate that is not a number."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from atomr import ActorSystem
from atomr.train import (
    GetWeights,
    LoadCheckpoint,
    LossKind,
    Mlp,
    OptimizerKind,
    SaveCheckpoint,
    SetLearningRate,
    Step,
    Trainer,
    TrainerConfig,
)


@pytest.mark.parametrize("message", [SaveCheckpoint, LoadCheckpoint])
def test_a_checkpoint_path_must_be_a_path(message: type, tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=rf"{message.__name__}\.path must be a str or os\.PathLike"):
        message(None)
    with pytest.raises(TypeError, match="got int"):
        message(3)
    with pytest.raises(ValueError, match=rf"{message.__name__}\.path is empty"):
        message("")
    assert message(tmp_path / "c.ckpt").path == tmp_path / "c.ckpt"
    assert message("c.ckpt").path == "c.ckpt"


@pytest.mark.parametrize("lr", ["0.1", None, True])
async def test_a_learning_rate_that_is_not_a_number_is_refused(lr: object) -> None:
    config = TrainerConfig(OptimizerKind.sgd(0.1), LossKind.CROSS_ENTROPY)
    x = np.ones((4, 3), np.float32)
    y = np.array([0, 1, 0, 1])
    async with ActorSystem("lr") as system:
        ref = await Trainer.spawn(system, Mlp([3, 4, 2], seed=0), "cpu:0", config)
        twin = await Trainer.spawn(system, Mlp([3, 4, 2], seed=0), "cpu:0", config)
        with pytest.raises(TypeError, match="lr must be a real number"):
            await ref.ask(SetLearningRate(lr))  # type: ignore[arg-type]
        for trainer in (ref, twin):  # the rate is unchanged: both step alike
            await trainer.ask(Step(x, y))
        np.testing.assert_array_equal(await ref.ask(GetWeights()), await twin.ask(GetWeights()))
