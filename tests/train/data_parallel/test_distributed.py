"""Hierarchical data parallel, 2 processes x 2 local devices under mpiexec:
equal to the single-device `Trainer` on the global batch, every replica of
every rank identical, initial weights from rank 0, checkpoints written by
rank 0 only and loadable by every rank, one saved inside an accumulation
window resumed by the job and by one device; a rank that leaves is named."""

from __future__ import annotations

import json

import numpy as np
import pytest

from atomr import ActorSystem
from atomr.train import GetWeights, LoadCheckpoint, Mlp, Step, Trainer, load_checkpoint
from tests.train.mpi_scripts import data_parallel_run as script
from tests.train.mpi_scripts.harness import run_script

pytestmark = pytest.mark.mpi

STEPS = 20
RANKS = 2


async def _reference() -> tuple[np.ndarray, np.ndarray, list[float]]:
    """One device, the global batch, rank 0's initial model."""
    model = Mlp(script.SIZES, activation="tanh", seed=100)
    losses = []
    async with ActorSystem() as system:
        ref = await Trainer.spawn(system, model, "cpu:0", script.config())
        for step in range(STEPS):
            x, y = script.batch(step)
            losses.append((await ref.ask(Step(x, y), timeout=30)).loss)
        final = await ref.ask(GetWeights(), timeout=30)
    return model.get_params(), final, losses


async def test_two_processes_two_devices_equal_one_device(tmp_path) -> None:
    result, _ = run_script(RANKS, "data_parallel_run.py", tmp_path, STEPS, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    initial, final, losses = await _reference()
    for rank in range(RANKS):
        start = np.load(tmp_path / f"rank{rank}_initial.npy")
        assert start.shape[0] == script.LOCAL_DEVICES
        for replica in start:  # rank 1 built its model from another seed
            np.testing.assert_array_equal(replica, initial)
    finals = [np.load(tmp_path / f"rank{r}_final.npy") for r in range(RANKS)]
    everyone = np.concatenate(finals)
    assert everyone.shape[0] == RANKS * script.LOCAL_DEVICES
    for replica in everyone:  # every replica of every process: the same bits
        np.testing.assert_array_equal(replica, everyone[0])
    assert not np.allclose(everyone[0], initial), "training did not move the weights"
    np.testing.assert_allclose(everyone[0], final, rtol=1e-4, atol=1e-5)
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(RANKS)]
    for report in reports:
        np.testing.assert_allclose(report["losses"], losses, rtol=1e-4, atol=1e-6)
    # checkpoints: written by rank 0 only, atomically, loaded by every rank
    assert [r["wrote_checkpoint"] for r in reports] == [True] + [False] * (RANKS - 1)
    assert sorted(p.name for p in tmp_path.iterdir() if "ckpt" in p.name) == ["ckpt.atomr"]
    saved = load_checkpoint(tmp_path / "ckpt.atomr")
    np.testing.assert_array_equal(saved.weights, everyone[0])
    assert saved.step == STEPS
    for rank in range(RANKS):
        for replica in np.load(tmp_path / f"rank{rank}_loaded.npy"):
            np.testing.assert_array_equal(replica, saved.weights)
    await _check_the_save_inside_a_window(tmp_path)


async def _check_the_save_inside_a_window(out) -> None:  # noqa: ANN001
    """Saved inside a window, the checkpoint holds every process's gradients:
    the job resumes it, and so does one device, as if never saved."""
    config = script.TrainerConfig(
        script.OptimizerKind.adam(0.01), script.LossKind.CROSS_ENTROPY, accumulation_steps=2
    )
    async with ActorSystem() as system:
        straight = await Trainer.spawn(system, Mlp(script.SIZES, "tanh", seed=100), "cpu:0", config)
        resumed = await Trainer.spawn(system, Mlp(script.SIZES, "tanh", seed=7), "cpu:0", config)
        await straight.ask(Step(*script.batch(100)), timeout=30)
        await resumed.ask(LoadCheckpoint(out / "window.atomr"), timeout=30)
        for trainer in (straight, resumed):
            assert (await trainer.ask(Step(*script.batch(101)), timeout=30)).applied
        want = await straight.ask(GetWeights(), timeout=30)
        np.testing.assert_allclose(await resumed.ask(GetWeights()), want, rtol=1e-5, atol=1e-6)
    assert load_checkpoint(out / "window.atomr").extra["micro"] == 1
    for rank in range(RANKS):
        for name in ("window", "window_again"):
            got = np.load(out / f"rank{rank}_{name}.npy")
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_rank_leaving_mid_training_is_named(tmp_path) -> None:
    result, elapsed = run_script(3, "data_parallel_run.py", tmp_path, STEPS, 2, timeout=90)
    output = result.stdout + result.stderr
    assert result.returncode not in (0, 124), output
    assert "rank 2 never joined" in output, output
    assert "CollectiveTimeoutError" in output, output
    assert elapsed < 40.0, f"took {elapsed:.1f} s"
    assert not (tmp_path / "ckpt.atomr").exists()
