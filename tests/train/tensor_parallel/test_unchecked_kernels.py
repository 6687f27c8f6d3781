"""A shard's step calls the backend's unchecked kernel entries (issue 22):
its buffers are its own or were checked where they came in (the trainer's
`validate_batch`, `sum_partials`'s shapes), as the single-device `Trainer`'s
are, so the checked entries' Python work (about 0.6 ms a step per shard,
holding the GIL the shard threads share) is not repeated before each kernel.
The results are unchanged: test_fused_rounds.py and test_trainer.py compare
them with the single-device Trainer's."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from atomr import ActorSystem
from atomr.accel import CpuBackend
from atomr.train import LossKind, Mlp, OptimizerKind, Step, TrainerConfig
from atomr.train.core import synthetic_classification
from atomr.train.tensor_parallel import TensorParallelTrainer

CHECKED = (
    "matmul",
    "bias_add",
    "bias_grad",
    "activation_forward",
    "activation_backward",
    "sum_into",
    "squared_norm",
    "scale",
)


@pytest.mark.parametrize("sizes", [[6, 11, 5], [6, 11, 9, 5]])
async def test_a_training_step_calls_no_checked_kernel_entry(
    actor_system: ActorSystem, monkeypatch: pytest.MonkeyPatch, sizes: list[int]
) -> None:
    """Every checked entry a shard's step could reach is counted; a step
    (one stage, two with a gathered last layer) calls none of them."""
    calls: list[str] = []

    def counting(name: str) -> Any:
        checked = getattr(CpuBackend, name)

        def entry(self: Any, *args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            return checked(self, *args, **kwargs)

        return entry

    model = Mlp(sizes, activation="tanh", seed=3)
    config = TrainerConfig(OptimizerKind.sgd(0.1), LossKind.CROSS_ENTROPY)
    tp = await TensorParallelTrainer.spawn(actor_system, model, ["cpu:0", "cpu:1"], config)
    x, y = synthetic_classification(12, sizes[0], sizes[-1], seed=0)
    await tp.ask(Step(x, y))  # builds the shards (their set-up may check)
    for name in CHECKED:
        monkeypatch.setattr(CpuBackend, name, counting(name))
    result = await tp.ask(Step(x, y))
    assert math.isfinite(result.loss)
    assert np.isfinite(result.grad_norm)
    assert calls == []
