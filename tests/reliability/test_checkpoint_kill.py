"""Checkpoints survive SIGKILL at random points while saving.

A forked child saves checkpoints in a loop (each one self-describing: its
weights and optimizer buffers are filled with its step number); the parent
kills it with SIGKILL after a random delay, 50 times. After every kill the
file at the target path must load, pass its checksum and be one whole
checkpoint (never a mix of two), and the step must never go back. Then every
byte-level corruption and truncation of a real checkpoint must be detected
with a `CheckpointError` naming the cause, and a trainer asked to load it
must refuse and keep its weights.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from atomr import ActorSystem
from atomr.train import (
    CheckpointError,
    GetWeights,
    LoadCheckpoint,
    LossKind,
    Mlp,
    OptimizerKind,
    SaveCheckpoint,
    Trainer,
    TrainerConfig,
    load_checkpoint,
)
from atomr.train.core import Checkpoint, save_checkpoint

KILLS = 50
N = 1_000_000  # 4 MB of weights + 8 MB of optimizer state: a save takes a while


def _ckpt(step: int) -> Checkpoint:
    fill = np.full(N, float(step), dtype=np.float32)
    return Checkpoint(
        model={"sizes": [1000, 1000], "activation": "relu"},
        weights=fill,
        step=step,
        optimizer={"kind": "adam", "step": step, "exp_avg": fill, "exp_avg_sq": fill},
        extra={"trainer": "kill-test"},
    )


def _save_forever(path: str, first_step: int) -> None:
    """Child process: save checkpoints with increasing steps until killed."""
    step = first_step
    while True:
        save_checkpoint(path, _ckpt(step))
        step += 1


def _check_whole(path: Path) -> int:
    ckpt = load_checkpoint(path)
    step = ckpt.step
    for arr in (ckpt.weights, ckpt.optimizer["exp_avg"], ckpt.optimizer["exp_avg_sq"]):
        assert arr.shape == (N,)
        assert arr[0] == step and arr[-1] == step and (arr == step).all()
    assert ckpt.optimizer["step"] == step
    return step


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_sigkill_while_saving_always_leaves_a_loadable_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "model.ckpt"
    save_checkpoint(path, _ckpt(0))
    ctx = multiprocessing.get_context("fork")
    rng = random.Random(11)
    last = 0
    mid_save = 0
    t0 = time.perf_counter()
    for _ in range(KILLS):
        child = ctx.Process(target=_save_forever, args=(str(path), last + 1), daemon=True)
        child.start()
        time.sleep(rng.uniform(0.0, 0.15))  # the fault: a SIGKILL at a random moment
        assert child.pid is not None
        os.kill(child.pid, signal.SIGKILL)
        child.join(timeout=10)
        assert child.exitcode == -signal.SIGKILL
        leftovers = list(tmp_path.glob(".model.ckpt.*.tmp"))
        mid_save += bool(leftovers)
        for tmp in leftovers:  # a killed save leaves its temp file; never the target
            tmp.unlink()
        step = _check_whole(path)
        assert step >= last
        last = step
    print(
        f"\n{KILLS} SIGKILLs in {time.perf_counter() - t0:.1f} s: {mid_save} landed mid-save "
        f"(temp file left), last good step {last}; the target always loaded whole"
    )
    assert mid_save > 0  # the kills did hit saves in progress


def test_every_truncation_and_corruption_is_detected(tmp_path: Path) -> None:
    path = tmp_path / "small.ckpt"
    model = Mlp([4, 8, 3], seed=0)
    save_checkpoint(path, Checkpoint(model=model.config(), weights=model.get_params(), step=3))
    raw = path.read_bytes()
    bad = tmp_path / "bad.ckpt"
    rng = random.Random(5)
    for cut in sorted({0, 1, 7, 8, 16, len(raw) // 2, len(raw) - 33, len(raw) - 1}):
        bad.write_bytes(raw[:cut])
        with pytest.raises(CheckpointError, match="truncated|checksum"):
            load_checkpoint(bad)
    for _ in range(200):
        i = rng.randrange(len(raw))
        flipped = bytearray(raw)
        flipped[i] ^= 1 << rng.randrange(8)
        bad.write_bytes(bytes(flipped))
        with pytest.raises(CheckpointError, match="checksum|magic"):
            load_checkpoint(bad)
    bad.write_bytes(raw + b"\0")
    with pytest.raises(CheckpointError):
        load_checkpoint(bad)


async def test_trainer_refuses_a_corrupted_checkpoint_and_keeps_its_weights(
    actor_system: ActorSystem, tmp_path: Path
) -> None:
    config = TrainerConfig(OptimizerKind.adam(0.01), LossKind.CROSS_ENTROPY)
    trainer = await Trainer.spawn(actor_system, Mlp([4, 8, 3], seed=1), "cpu:0", config)
    good = tmp_path / "good.ckpt"
    await trainer.ask(SaveCheckpoint(good), timeout=30)
    raw = good.read_bytes()
    other = await Trainer.spawn(actor_system, Mlp([4, 8, 3], seed=2), "cpu:0", config)
    before = await other.ask(GetWeights(), timeout=30)
    bad = tmp_path / "bad.ckpt"
    for damaged in (
        raw[: len(raw) // 3],
        raw[:-1],
        raw[:100] + bytes([raw[100] ^ 0xFF]) + raw[101:],
    ):
        bad.write_bytes(damaged)
        with pytest.raises(CheckpointError):
            await other.ask(LoadCheckpoint(bad), timeout=30)
        np.testing.assert_array_equal(await other.ask(GetWeights(), timeout=30), before)
    await other.ask(LoadCheckpoint(good), timeout=30)  # still alive and able to load
    np.testing.assert_array_equal(
        await other.ask(GetWeights(), timeout=30), await trainer.ask(GetWeights(), timeout=30)
    )
