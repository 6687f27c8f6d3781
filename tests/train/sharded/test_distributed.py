"""Sharded data parallel across 2 MPI processes x 2 replicas (MPI's own
Reduce_scatter and Allgather between the processes): each of ZeRO stages 1,
2, 3 equals the single-device `Trainer` on the global batch for 20 steps,
every rank assembles the same weights, process 0's initial weights win, and
the checkpoint holds them (written by rank 0, or at stage 3 one file per
replica by every process, merged on load)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from atomr import ActorSystem
from atomr.train import GetWeights, Mlp, Step, Trainer
from atomr.train.sharded import merge_shards
from tests.train.mpi_scripts import sharded_run as script
from tests.train.mpi_scripts import sharded_step_fault as fault
from tests.train.mpi_scripts.harness import run_script

pytestmark = pytest.mark.mpi

STEPS = 20
RANKS = 2


async def _reference(stage: int) -> tuple[np.ndarray, list[float], list[float]]:
    """One device, the global batch, rank 0's initial model."""
    model = Mlp(script.SIZES, activation="tanh", seed=100)
    losses, norms = [], []
    async with ActorSystem() as system:
        ref = await Trainer.spawn(system, model, "cpu:0", script.config(stage))
        for step in range(STEPS):
            stats = await ref.ask(Step(*script.batch(step)), timeout=30)
            losses.append(stats.loss)
            norms.append(stats.grad_norm)
        return await ref.ask(GetWeights(), timeout=30), losses, norms


async def test_two_processes_two_replicas_equal_one_device_at_every_stage(tmp_path) -> None:
    result, _ = run_script(RANKS, "sharded_run.py", tmp_path, STEPS, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    for stage in script.STAGES:
        final, losses, norms = await _reference(stage)
        for rank in range(RANKS):
            weights = np.load(tmp_path / f"rank{rank}_stage{stage}.npy")
            np.testing.assert_allclose(weights, final, rtol=1e-5, atol=1e-6)
            report = json.loads((tmp_path / f"rank{rank}_stage{stage}.json").read_text())
            np.testing.assert_allclose(report["losses"], losses, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(report["grad_norms"], norms, rtol=1e-5, atol=1e-6)
        assert max(norms) > 0.5  # clipping really happened
        saved = merge_shards(tmp_path / f"stage{stage}.ckpt")
        np.testing.assert_array_equal(saved.weights, np.load(tmp_path / f"rank0_stage{stage}.npy"))
        assert saved.step == STEPS
    shards = sorted(p.name for p in tmp_path.glob("stage3.ckpt.gen-2.*"))
    assert shards == [f"stage3.ckpt.gen-2.shard-{g}-of-4" for g in range(4)]
    # the third save failed on rank 1's disk: every rank failed, none hung,
    # and the index still names the second save's files (merged above)
    failed = [(tmp_path / f"rank{r}_failed_save.txt").read_text() for r in range(RANKS)]
    assert failed == ["CheckpointError", "OSError"]


async def _trained(steps: tuple[int, ...]) -> np.ndarray:
    """The single-device weights after the fault scripts' batches `steps`."""
    async with ActorSystem() as system:
        one = await Trainer.spawn(system, Mlp(fault.SIZES, seed=1), "cpu:0", fault.CONFIG)
        for step in steps:
            await one.ask(Step(*fault.batch(step)), timeout=30)
        return await one.ask(GetWeights(), timeout=30)


@pytest.mark.parametrize(
    ("name", "steps", "counted", "says"),
    [
        ("forward", (0, 2), 1, "(rank 1) failed"),  # nothing applied on any process
        ("backward", (0, 2), 1, "(rank 1) failed"),
        ("apply", (0, 2), 1, "rolled back"),
        ("commit", (0, 1, 2), 2, "did not commit"),  # completed before the next request
    ],
)
async def test_a_step_failing_on_one_process_fails_it_on_every_process(
    tmp_path, name: str, steps: tuple[int, ...], counted: int, says: str
) -> None:
    result, _ = run_script(RANKS, "sharded_step_fault.py", tmp_path, name, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    expected = await _trained(steps)
    for stage in fault.STAGES:
        errors = [json.loads((tmp_path / f"rank{r}_stage{stage}.json").read_text()) for r in (0, 1)]
        assert "other process" in errors[0]["message"]
        assert says in errors[0]["message"]
        assert "injected failure" in errors[1]["message"]  # rank 1's own error
        for rank in range(RANKS):
            assert errors[rank]["steps"] == counted
            weights = np.load(tmp_path / f"rank{rank}_stage{stage}.npy")
            np.testing.assert_allclose(weights, expected, rtol=1e-5, atol=1e-6)


async def test_an_evaluation_failing_on_one_process_at_stage_3_fails_it_on_every_process(
    tmp_path,
) -> None:
    """Stage 3's evaluation joins the other processes' layer all-gathers, so
    all of them end it (not CollectiveTimeoutError) and stay in step; at
    stages 1 and 2 it is local and only the failing process's fails."""
    result, _ = run_script(RANKS, "sharded_step_fault.py", tmp_path, "evaluate", timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    expected = await _trained((0, 1, 2))  # every step trained
    for stage in fault.STAGES:
        reports = [
            json.loads((tmp_path / f"rank{r}_stage{stage}.json").read_text()) for r in (0, 1)
        ]
        assert "injected failure" in reports[1]["message"]  # rank 1's own error
        if stage == 3:
            assert reports[0]["type"] == "OtherProcessFailed"
            assert "1 other process(es) failed to evaluate" in reports[0]["message"]
        else:
            assert reports[0]["type"] is None
        for rank in range(RANKS):
            assert reports[rank]["steps"] == 1
            weights = np.load(tmp_path / f"rank{rank}_stage{stage}.npy")
            np.testing.assert_allclose(weights, expected, rtol=1e-5, atol=1e-6)


async def test_a_load_failing_on_one_process_changes_nothing_on_any(tmp_path) -> None:
    result, _ = run_script(RANKS, "sharded_load_fault.py", tmp_path, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    expected = await _trained((0, 1, 2, 3))  # as if no load was asked
    for stage in fault.STAGES:
        reports = [
            json.loads((tmp_path / f"rank{r}_stage{stage}.json").read_text()) for r in (0, 1)
        ]
        assert reports[0]["type"] == "CheckpointError"
        assert "other process" in reports[0]["message"]
        own = "RuntimeError" if stage == 2 else "FileNotFoundError"
        assert reports[1]["type"] == own  # rank 1's own error
        for rank in range(RANKS):
            assert reports[rank]["steps"] == 4
            weights = np.load(tmp_path / f"rank{rank}_stage{stage}.npy")
            np.testing.assert_allclose(weights, expected, rtol=1e-5, atol=1e-6)
