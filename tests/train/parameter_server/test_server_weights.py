"""A server shard's weights, given when it is built (`initial_weights`) or
as a whole state (`SetServerState`), are real numbers finite in the dtype
it holds them in: the rule of every parameter vector (`real_vector`, built
on `validation.cast_finite`), each refusal changing nothing."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from atomr.train import OptimizerKind
from atomr.train.parameter_server.messages import (
    GetServerState,
    PullWeights,
    PushGradient,
    ServerState,
    SetServerState,
)
from atomr.train.parameter_server.server import ServerShard


@pytest.mark.parametrize(
    ("weights", "error", "message"),
    [
        (np.array([1.0, np.nan]), ValueError, "initial_weights contain NaN or Inf"),
        (
            np.array([1.0, 1e39]),
            ValueError,
            "initial_weights hold values too large for float32 (NaN or Inf after the cast)",
        ),
        (
            np.array([True, False]),
            TypeError,
            "initial_weights must be real numbers, got dtype bool",
        ),
        (
            np.array([1 + 2j]),
            TypeError,
            "initial_weights must be real numbers, got dtype complex128",
        ),
        (np.zeros(0), ValueError, "initial_weights must be a non-empty vector"),
    ],
)
def test_initial_weights_are_refused_unless_real_and_finite_in_float32(
    weights: np.ndarray, error: type, message: str
) -> None:
    """Bools were taken as 1.0 and 0.0 (complex numbers with a warning), and
    1e39 was refused as 'a non-empty finite vector', which it is in float64."""
    with pytest.raises(error) as info:
        ServerShard(weights, 0.1)
    assert str(info.value) == message


async def test_a_float64_shard_takes_weights_finite_in_float64_and_copies_them(
    actor_system,
) -> None:
    given = np.array([1e39, -2.0])
    ref = actor_system.spawn(ServerShard.props(given, 0.1, dtype=np.float64))
    given[0] = np.nan  # the caller's array changes after the shard is built
    weights, _ = await ref.ask(PullWeights(0))
    assert weights.dtype == np.float64
    np.testing.assert_array_equal(weights, [1e39, -2.0])
    with pytest.raises(ValueError, match="initial_weights contain NaN or Inf"):
        ServerShard(np.array([np.inf, 1.0]), 0.1, dtype=np.float64)


def _state(weights: Any, like: ServerState) -> SetServerState:
    return SetServerState(ServerState(weights, like.optimizer, 7))


@pytest.mark.parametrize(
    ("weights", "error", "message"),
    [
        (np.array([1.0, np.nan]), ValueError, "the state's weights contain NaN or Inf"),
        (
            np.array([1.0, 1e39]),
            ValueError,
            "the state's weights hold values too large for float32 (NaN or Inf after the cast)",
        ),
        (np.array([True, False]), TypeError, "the state's weights must be real numbers"),
        (np.zeros(3), ValueError, "state holds 3 weights, server has 2"),
    ],
)
async def test_a_whole_state_of_weights_not_finite_in_the_shard_s_dtype_changes_nothing(
    actor_system, weights: np.ndarray, error: type, message: str
) -> None:
    """Bools were taken as 1.0 and 0.0; NaN and 1e39 were refused as
    '(finite needed)' next to a count of weights that was right."""
    ref = actor_system.spawn(ServerShard.props(np.array([10.0, 20.0]), OptimizerKind.sgd(0.1)))
    await ref.ask(PushGradient(0, 0, np.array([1.0, 2.0], dtype=np.float32)))
    state = await ref.ask(GetServerState())
    with pytest.raises(error) as info:
        await ref.ask(_state(weights, state))
    assert str(info.value).startswith(message)
    after = await ref.ask(GetServerState())
    np.testing.assert_array_equal(after.weights, state.weights)
    assert after.version == state.version == 1


async def test_a_float64_shard_takes_a_state_finite_in_float64(actor_system) -> None:
    ref = actor_system.spawn(ServerShard.props(np.array([10.0, 20.0]), 0.1, dtype=np.float64))
    state = await ref.ask(GetServerState())
    await ref.ask(_state(np.array([1e39, -1e300]), state))
    weights, version = await ref.ask(PullWeights(0))
    np.testing.assert_array_equal(weights, [1e39, -1e300])
    assert version == 7
