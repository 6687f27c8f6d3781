"""A pushed gradient is checked finite in the dtype it is applied in, the
shard's (`validation.cast_finite`), before anything changes: a float64
gradient holding 1e39 is refused by a float32 shard (and by a client of
float32 shards, before anything is sent) with `NonFiniteError` naming the
overflow, as a gradient holding NaN is refused; a float64 shard takes it."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from atomr.train import OptimizerKind
from atomr.train.core.errors import NonFiniteError
from atomr.train.parameter_server._client import ShardedClient
from atomr.train.parameter_server.consistency import Consistency
from atomr.train.parameter_server.messages import PullWeights, PushGradient, Stats
from atomr.train.parameter_server.server import ServerShard

T = 5.0  # seconds per ask: a refusal is prompt, never held in a round

HUGE = np.array([1e39, 1.0])  # finite in float64, inf in float32


def _shard(actor_system: Any, dtype: Any, synchronous: bool, values: Any = (0.0, 0.0)) -> Any:
    """A shard on `values` with plain SGD at rate 1 (two workers when synchronous)."""
    sync = {"consistency": Consistency.synchronous(), "workers": 2} if synchronous else {}
    weights = np.array(values, dtype=dtype)
    props = ServerShard.props(weights, OptimizerKind.sgd(1.0), None, dtype=dtype, **sync)
    return actor_system.spawn(props)


async def _unchanged(ref: Any, dtype: Any, values: Any = (0.0, 0.0)) -> None:
    weights, version = await ref.ask(PullWeights(0), timeout=T)
    assert version == 0 and weights.dtype == dtype
    np.testing.assert_array_equal(weights, np.array(values, dtype=dtype))
    stats = await ref.ask(Stats(), timeout=T)
    assert (stats.version, stats.gradients_applied) == (0, 0)


async def test_an_async_float32_shard_refuses_a_gradient_too_large_for_it(actor_system) -> None:
    ref = _shard(actor_system, np.float32, False)
    with pytest.raises(NonFiniteError, match="too large for float32"):
        await ref.ask(PushGradient(0, 0, HUGE.copy()), timeout=T)
    await _unchanged(ref, np.float32)
    assert await ref.ask(PushGradient(0, 0, np.array([1.0, 2.0])), timeout=T) == 1  # goes on
    weights, _ = await ref.ask(PullWeights(0), timeout=T)
    np.testing.assert_array_equal(weights, np.array([-1.0, -2.0], dtype=np.float32))


async def test_a_synchronous_float32_shard_refuses_it_and_the_round_goes_on(actor_system) -> None:
    """The push is refused before it joins the round (the round is not
    dropped, the other worker's push still waits in it); the worker then
    pushes a gradient that fits, and the round completes with it."""
    ref = _shard(actor_system, np.float32, True)
    other = asyncio.ensure_future(ref.ask(PushGradient(1, 0, np.float32([0, 2])), timeout=T))
    with pytest.raises(NonFiniteError, match="too large for float32"):
        await ref.ask(PushGradient(0, 0, HUGE.copy()), timeout=T)
    assert not other.done()  # still held: the round was not dropped
    await _unchanged(ref, np.float32)
    assert await ref.ask(PushGradient(0, 0, np.array([2.0, 0.0])), timeout=T) == 1
    assert await asyncio.wait_for(other, T) == 1
    weights, _ = await ref.ask(PullWeights(0), timeout=T)
    np.testing.assert_array_equal(weights, np.float32([-1.0, -1.0]))


@pytest.mark.parametrize("synchronous", [False, True], ids=["async", "sync"])
async def test_a_float64_shard_takes_it(actor_system, synchronous: bool) -> None:
    ref = _shard(actor_system, np.float64, synchronous)
    pushes = [ref.ask(PushGradient(0, 0, HUGE.copy()), timeout=T)]
    if synchronous:
        pushes.append(ref.ask(PushGradient(1, 0, HUGE.copy()), timeout=T))
    assert await asyncio.gather(*pushes) == [1] * len(pushes)
    weights, _ = await ref.ask(PullWeights(0), timeout=T)
    np.testing.assert_array_equal(weights, -HUGE)


async def test_a_held_synchronous_gradient_is_a_copy(actor_system) -> None:
    """A gradient already in the shard's dtype is held in the round as a
    copy: the pusher changing its array before the round completes changes
    nothing applied."""
    ref = _shard(actor_system, np.float32, True)
    grad = np.float32([2.0, 0.0])
    first = asyncio.ensure_future(ref.ask(PushGradient(0, 0, grad), timeout=T))
    # tasks start in order: the push is sent, then Stats, answered once the push is held
    await asyncio.ensure_future(ref.ask(Stats(), timeout=T))
    assert not first.done()
    grad[:] = 100.0
    assert await ref.ask(PushGradient(1, 0, np.float32([0, 2])), timeout=T) == 1
    assert await asyncio.wait_for(first, T) == 1
    weights, _ = await ref.ask(PullWeights(0), timeout=T)
    np.testing.assert_array_equal(weights, np.float32([-1.0, -1.0]))


def _client(actor_system: Any, dtype: Any) -> tuple[ShardedClient, list[Any]]:
    """Two asynchronous shards of `dtype` on `[0, 0 | 0, 0]` and their client."""
    shards = [_shard(actor_system, dtype, False) for _ in range(2)]
    return ShardedClient(shards, [(0, 2), (2, 4)], False, T, dtype), shards


async def test_a_client_of_float32_shards_sends_nothing_too_large_for_them(actor_system) -> None:
    """1e39 in the second shard's range: refused before anything is sent
    (it was sent, applied by the first shard, refused by the second and
    rolled back with `RoundFailedError`)."""
    client, shards = _client(actor_system, np.float32)
    with pytest.raises(NonFiniteError, match="too large for float32"):
        await client.push(0, [0, 0], np.array([1.0, 1.0, 1e39, 1.0]), round_id=0)
    for ref in shards:
        await _unchanged(ref, np.float32)
    assert await client.push(0, [0, 0], np.array([1.0, 1.0, 1.0, 1.0]), round_id=1) == [1, 1]


async def test_a_client_of_float64_shards_sends_it(actor_system) -> None:
    client, _ = _client(actor_system, np.float64)
    grad = np.array([1.0, 1.0, 1e39, 1.0])
    assert await client.push(0, [0, 0], grad, round_id=0) == [1, 1]
    weights, versions = await client.pull(0)
    assert versions == [1, 1]
    np.testing.assert_array_equal(weights, -grad)


@pytest.mark.parametrize("gradient", [np.array([1, 0, 1, 0]), np.array([True] * 4)])
async def test_a_client_refuses_a_gradient_that_is_no_float_array(actor_system, gradient) -> None:
    client, shards = _client(actor_system, np.float32)
    with pytest.raises(TypeError, match="float numpy array"):
        await client.push(0, [0, 0], gradient, round_id=0)
    for ref in shards:
        await _unchanged(ref, np.float32)


def test_a_client_refuses_a_dtype_no_model_computes_in(actor_system) -> None:
    with pytest.raises(ValueError, match="float32 or float64"):
        ShardedClient([object()], [(0, 2)], False, T, np.float16)  # type: ignore[list-item]
