"""A sharded replica refuses the messages of the other pass design (stages
1-2 run whole-model passes, stage 3 gathers layer by layer) with a
`Failure` naming both stages, and stays usable."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from atomr import ActorSystem, Props
from atomr.accel import cpu_devices
from atomr.train import CheckpointError, LossKind, Mlp, OptimizerKind, TrainerConfig
from atomr.train.data_parallel.messages import EvaluateShard
from atomr.train.sharded import ShardedReplica
from atomr.train.sharded.layout import ShardLayout
from atomr.train.sharded.messages import (
    BackwardLayer,
    ComputeShardGradients,
    ForwardLayer,
    GetShardState,
    SetFullParams,
    SetShardState,
    ShardLayerParams,
    ShardReplicaState,
)

CONFIG = TrainerConfig(OptimizerKind.sgd(0.1), LossKind.CROSS_ENTROPY)
X = np.zeros((4, 5), dtype=np.float32)
Y = np.zeros(4, dtype=np.int64)
MODEL = Mlp([5, 3, 2], seed=0)

STAGES_1_2: list[Any] = [
    ComputeShardGradients(X, Y),
    SetFullParams(MODEL.get_params()),
    EvaluateShard(X, Y),
]
STAGE_3: list[Any] = [ShardLayerParams(0), ForwardLayer(0, None, X, Y), BackwardLayer(0, None)]


def _replica(system: ActorSystem, stage: int) -> Any:
    layout = ShardLayout.for_model(MODEL, stage, 1)
    device = cpu_devices(1)[0]
    return system.spawn(Props(ShardedReplica, MODEL, device, CONFIG, stage, layout, 0))


@pytest.mark.parametrize(
    ("stage", "message"),
    [(3, m) for m in STAGES_1_2] + [(s, m) for s in (1, 2) for m in STAGE_3],
    ids=lambda v: type(v).__name__ if not isinstance(v, int) else f"stage{v}",
)
async def test_a_message_of_the_other_stage_is_refused(stage: int, message: Any) -> None:
    async with ActorSystem("stages") as system:
        ref = _replica(system, stage)
        before = await ref.ask(GetShardState(), timeout=30)
        with pytest.raises(TypeError, match=r"is for ZeRO stage .* this replica runs stage"):
            await ref.ask(message, timeout=30)
        after = await ref.ask(GetShardState(), timeout=30)  # still alive, nothing changed
        np.testing.assert_array_equal(after.piece, before.piece)
        assert after.steps == before.steps


@pytest.mark.parametrize("stage", [1, 2])
async def test_its_own_stage_messages_are_answered(stage: int) -> None:
    async with ActorSystem("stages") as system:
        ref = _replica(system, stage)
        result = await ref.ask(ComputeShardGradients(X, Y), timeout=30)
        assert result.samples == 4


@pytest.mark.parametrize("stage", [1, 3])
async def test_a_state_whose_piece_is_not_finite_in_the_model_s_dtype_changes_nothing(
    stage: int,
) -> None:
    """The piece was cast without a check: 1e39 became inf in float32 and NaN
    was taken, as the replica's weights; now the rule of every array used
    in a dtype (`cast_finite`) refuses it, the replica keeping its state."""
    async with ActorSystem("stages") as system:
        ref = _replica(system, stage)
        before = await ref.ask(GetShardState(), timeout=30)
        n = before.piece.shape[0]
        for bad, message in [
            (np.full(n, 1e39), "hold values too large for float32 (NaN or Inf after the cast)"),
            (np.r_[np.zeros(n - 1), np.nan].astype(np.float32), "contain NaN or Inf"),
        ]:
            state = ShardReplicaState(bad, before.optimizer, 5)
            with pytest.raises(CheckpointError) as info:
                await ref.ask(SetShardState(state), timeout=30)
            assert str(info.value) == f"replica 0's piece values {message}"
            after = await ref.ask(GetShardState(), timeout=30)
            np.testing.assert_array_equal(after.piece, before.piece)
            assert after.steps == before.steps
