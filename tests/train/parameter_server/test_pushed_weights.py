"""A push answered with the weights it left (`PushGradient.return_weights`)
saves the worker's next pull where that pull would give the same: in
synchronous mode (until a checkpoint replaces the weights); the asynchronous
and bounded models pull for every batch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from atomr.train import LoadCheckpoint, Mlp, SaveCheckpoint, Step
from atomr.train.data_parallel.trainer import DataParallelTrainer
from atomr.train.parameter_server import Consistency, TrainEpochs
from tests.train.parameter_server.common import SIZES, T, batches, config, server_stats, spawn
from tests.train.parameter_server.common import weights as weights_of

DEVICES = ["cpu:0", "cpu:1"]


async def _pulls(ps) -> int:
    return (await server_stats(ps))[0].weights_pulled


async def test_synchronous_steps_pull_once_and_still_equal_data_parallel(actor_system) -> None:
    ps = await spawn(actor_system, Mlp(SIZES, seed=0), DEVICES, config(), workers=2,
                     consistency=Consistency.synchronous())  # fmt: skip
    dp = await DataParallelTrainer.spawn(actor_system, Mlp(SIZES, seed=0), DEVICES, config())
    for x, y in batches(4, 32):
        await ps.ask(Step(x, y), timeout=T)
        await dp.ask(Step(x, y), timeout=T)
    assert await _pulls(ps) == 2  # each worker's first batch only
    np.testing.assert_allclose(await weights_of(ps), await weights_of(dp), rtol=1e-5, atol=1e-6)


async def test_a_loaded_checkpoint_makes_every_worker_pull_again(actor_system, tmp_path: Path):
    # B's checkpoint has A's version (two rounds each) but other weights: were
    # A's workers to start from the weights their last push returned, their
    # pushes would pass as fresh and the step after the load would differ
    def sync_ps():
        return spawn(actor_system, Mlp(SIZES, seed=0), DEVICES, config(), workers=2,
                     consistency=Consistency.synchronous())  # fmt: skip

    a, b = await sync_ps(), await sync_ps()
    data = list(batches(5, 32))
    for x, y in data[:2]:
        await a.ask(Step(x, y), timeout=T)
    for x, y in data[2:4]:
        await b.ask(Step(x, y), timeout=T)
    await b.ask(SaveCheckpoint(tmp_path / "b.npz"), timeout=T)
    pulls = await _pulls(a)
    await a.ask(LoadCheckpoint(tmp_path / "b.npz"), timeout=T)
    await a.ask(Step(*data[4]), timeout=T)
    await b.ask(Step(*data[4]), timeout=T)
    assert await _pulls(a) == pulls + 2
    np.testing.assert_array_equal(await weights_of(a), await weights_of(b))


async def test_asynchronous_steps_pull_fresh_weights_every_time(actor_system) -> None:
    ps = await spawn(actor_system, Mlp(SIZES, seed=0), DEVICES, config(), workers=2)
    for x, y in batches(3, 32):
        await ps.ask(Step(x, y), timeout=T)
    assert await _pulls(ps) == 3 * 2


@pytest.mark.parametrize(
    "consistency", [Consistency.asynchronous(), Consistency.bounded(1)], ids=["async", "bounded"]
)
async def test_an_epoch_run_pulls_for_every_batch_unless_synchronous(
    actor_system, consistency: Consistency
) -> None:
    ps = await spawn(actor_system, Mlp(SIZES, seed=0), DEVICES, config(), workers=2,
                     consistency=consistency)  # fmt: skip
    x, y = np.concatenate([b[0] for b in batches(10, 32)]), np.arange(320) % SIZES[-1]
    await ps.ask(TrainEpochs(x, y, 1, 32), timeout=T)
    stats = (await server_stats(ps))[0]
    assert stats.gradients_applied == 20
    # one pull per batch, and one more for each stale push recomputed
    assert stats.weights_pulled == 20 + stats.gradients_rejected
