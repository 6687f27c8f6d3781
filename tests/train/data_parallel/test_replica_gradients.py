"""A replica's `SetGradients` takes real numbers finite in the model's dtype
(`real_vector`, the rule of every given vector), refusing anything else with
its buffer unchanged."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from atomr import ActorSystem, Props
from atomr.train import LossKind, Mlp, OptimizerKind, TrainerConfig
from atomr.train.data_parallel import ReplicaActor
from atomr.train.data_parallel.messages import GetGradients, SetGradients

CONFIG = TrainerConfig(OptimizerKind.sgd(0.1), LossKind.CROSS_ENTROPY)
N = Mlp([2, 3]).n_params  # 9


@pytest.mark.parametrize(
    ("gradients", "error", "message"),
    [
        (np.r_[np.zeros(8), np.nan], ValueError, "gradients contain NaN or Inf"),
        (
            np.full(N, 1e39),
            ValueError,
            "gradients hold values too large for float32 (NaN or Inf after the cast)",
        ),
        (np.ones(N, dtype=bool), TypeError, "gradients must be real numbers, got dtype bool"),
        (np.zeros(N + 1), ValueError, f"gradients must be {N} values, got {N + 1}"),
    ],
)
async def test_set_gradients_refuses_what_the_model_s_dtype_cannot_hold(
    gradients: Any, error: type, message: str
) -> None:
    """Bools were taken as 1.0; 1e39 was refused as not '9 finite values'
    while it held 9 values."""
    async with ActorSystem("replica") as system:
        ref = system.spawn(Props(ReplicaActor, Mlp([2, 3], seed=0), "cpu:0", CONFIG))
        await ref.ask(SetGradients(np.full(N, 0.5)))
        with pytest.raises(error) as info:
            await ref.ask(SetGradients(gradients))
        assert str(info.value) == message
        np.testing.assert_array_equal(await ref.ask(GetGradients()), np.full(N, 0.5))


async def test_a_float64_replica_takes_gradients_finite_in_float64() -> None:
    model = Mlp([2, 3], seed=0, dtype=np.float64)
    async with ActorSystem("replica") as system:
        ref = system.spawn(Props(ReplicaActor, model, "cpu:0", CONFIG))
        await ref.ask(SetGradients(np.full(N, 1e39)))
        got = await ref.ask(GetGradients())
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, np.full(N, 1e39))
