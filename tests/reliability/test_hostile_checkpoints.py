"""Hostile checkpoint files (issue 17): a valid checksum proves integrity, not trust.

Every file here is crafted by the test itself with a correct SHA-256, so the
checksum cannot be what refuses it. Each must be a `CheckpointError` naming
the field, raised before anything is allocated for that field, and a trainer
that is asked to load one must keep its weights, step and optimizer state.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import threading
import tracemalloc
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atomr import ActorSystem
from atomr.accel import cpu_devices
from atomr.train import (
    AsyncParameterServer,
    CheckpointError,
    DataParallelOptions,
    DataParallelTrainer,
    GetWeights,
    LoadCheckpoint,
    LossKind,
    Mlp,
    OptimizerKind,
    ParameterServerOptions,
    PipelineOptions,
    PipelineParallelTrainer,
    SaveCheckpoint,
    Step,
    TensorParallelTrainer,
    Trainer,
    TrainerConfig,
    load_checkpoint,
)
from atomr.train.core import Checkpoint, save_checkpoint, synthetic_classification
from atomr.train.core.checkpoint import MAGIC, check_optimizer_state
from atomr.train.parameter_server import Consistency

N = 10


def _member(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, array, allow_pickle=False)
    return buf.getvalue()


def _craft(
    path: Path,
    *,
    header: dict[str, Any] | None = None,
    members: dict[str, bytes] | None = None,
    compression: int = zipfile.ZIP_STORED,
) -> Path:
    """Write a checkpoint with a correct checksum around whatever it is given."""
    if members is None:
        members = {"weights.npy": _member(np.zeros(N, np.float32))}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=compression) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    payload = buf.getvalue()
    fields: dict[str, Any] = {"model": {}, "step": 3, "optimizer": {}, "extra": {}}
    fields.update(header or {})
    fields.setdefault("payload_len", len(payload))
    text = json.dumps(fields).encode()
    body = MAGIC + len(text).to_bytes(8, "little") + text + payload
    path.write_bytes(body + hashlib.sha256(body).digest())
    return path


def test_a_crafted_file_with_nothing_wrong_loads(tmp_path: Path) -> None:
    ckpt = load_checkpoint(_craft(tmp_path / "ok.ckpt"))
    assert ckpt.step == 3 and ckpt.weights.shape == (N,)


@pytest.mark.parametrize(
    ("header", "field"),
    [
        ({"step": -5}, "step"),
        ({"step": 1e308}, "step"),
        ({"step": True}, "step"),
        ({"step": 2**70}, "step"),
        ({"optimizer": {"step": -1}}, "optimizer.step"),
        ({"optimizer": {"kind": {"name": "adam", "lr": float("inf")}}}, "optimizer.kind.lr"),
        ({"optimizer": {"kind": {"name": "adam", "eps": float("nan")}}}, "optimizer.kind.eps"),
        ({"model": [1, 2]}, "model"),
        ({"payload_len": 10**30}, "payload_len"),
        # integers beyond float's range: an OverflowError before
        ({"optimizer": {"kind": {"name": "adam", "lr": 10**400}}}, "optimizer.kind.lr"),
        ({"optimizer": {"kind": {"schedule": {"gamma": -(10**400)}}}}, "schedule.gamma"),
        ({"optimizer": {"kind": {"schedule": {"step_size": 10**400}}}}, "schedule.step_size"),
        ({"model": {"sizes": [4, 10**400, 3]}}, "model.sizes[1]"),
        ({"extra": {"micro": 10**400}}, "extra.micro"),
    ],
)
def test_header_fields_are_checked(tmp_path: Path, header: dict[str, Any], field: str) -> None:
    path = _craft(tmp_path / "h.ckpt", header=header)
    with pytest.raises(CheckpointError, match=re.escape(field)):
        load_checkpoint(path)


def test_optimizer_numbers_are_read_as_float64(tmp_path: Path) -> None:
    """lr=1e39 is a float64 model's rate: the file loads; a float32 trainer
    refuses it when it loads the state (`check_optimizer_state`)."""
    optimizer = {"kind": {"name": "sgd", "lr": 1e39}, "step": 0}
    ckpt = load_checkpoint(_craft(tmp_path / "h.ckpt", header={"optimizer": optimizer}))
    kind = OptimizerKind.sgd(0.1)
    check_optimizer_state(ckpt, kind, N, np.float64)
    with pytest.raises(CheckpointError, match="sgd cannot compute in float32: lr must be finite"):
        check_optimizer_state(ckpt, kind, N, np.float32)


_NON_FINITE = ": the values of payload member '%s.npy' contain NaN or Inf$"


@pytest.mark.parametrize(
    ("members", "field"),
    [
        ({"weights.npy": b"\x00" * 64}, "weights"),  # raw bytes, no array header
        ({"weights.npy": _member(np.frombuffer(b"x" * N, "S1"))}, "weights"),
        ({"weights.npy": _member(np.full(N, np.nan, np.float32))}, _NON_FINITE % "weights"),
        (
            {"weights.npy": _member(np.full(N, -np.inf))},
            _NON_FINITE % "weights",
        ),  # 1e300: float64's
        ({"weights.npy": _member(np.zeros((2, 5), np.float32))}, "weights"),
        ({"weights.npy": _member(np.zeros(N, np.int32))}, "weights"),
        ({}, "weights"),
        (
            {
                "weights.npy": _member(np.zeros(N, np.float32)),
                "optimizer/exp_avg.npy": _member(np.full(N, np.inf, np.float32)),
            },
            _NON_FINITE % "optimizer/exp_avg",
        ),
        (
            {"weights.npy": _member(np.zeros(N, np.float32)), "evil.pkl": b"\x80\x04."},
            "evil.pkl",
        ),
        (
            {"weights.npy": _member(np.zeros(N, np.float32)), "extra/a/b.npy": b""},
            "extra/a/b.npy",
        ),
    ],
)
def test_array_members_are_checked(tmp_path: Path, members: dict[str, bytes], field: str) -> None:
    path = _craft(tmp_path / "m.ckpt", members=members)
    with pytest.raises(CheckpointError, match=field):
        load_checkpoint(path)


def test_an_array_header_larger_than_its_member_is_refused_unallocated(tmp_path: Path) -> None:
    small = _member(np.zeros(N, np.float32))
    huge = small.replace(b"(10,)", b"(10000000000,)")  # header only: ~40 GB claimed
    huge = huge[:10] + huge[10:].replace(b"   ", b"", 1)  # keep the header's length aligned
    path = _craft(tmp_path / "big.ckpt", members={"weights.npy": huge})
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError, match="weights"):
            load_checkpoint(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20


def _empty_with_shape(shape: tuple[int, ...]) -> bytes:
    buf = io.BytesIO()
    header = {"descr": "<f4", "fortran_order": False, "shape": shape}
    np.lib.format.write_array_header_1_0(buf, header)
    return buf.getvalue()  # no data: the shape's size is 0


def test_an_empty_array_of_an_unindexable_shape_is_a_checkpoint_error(tmp_path: Path) -> None:
    members = {
        "weights.npy": _member(np.zeros(N, np.float32)),
        "extra/big.npy": _empty_with_shape((0, 2**62, 2**62)),
    }
    path = _craft(tmp_path / "shape.ckpt", members=members)
    with pytest.raises(CheckpointError, match="extra/big"):
        load_checkpoint(path)


def test_a_large_file_of_another_kind_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "disk.img"
    with open(path, "wb") as file:
        file.write(b"NOTACKPT")
        file.truncate(256 * 2**20)  # sparse: no disk used
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError, match="magic"):
            load_checkpoint(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2**20


def test_a_deflate_bomb_is_refused_without_inflating_it(tmp_path: Path) -> None:
    bomb = _member(np.zeros(64 * 2**20 // 4, np.float32))  # 64 MB of zeros, ~64 KB deflated
    path = _craft(tmp_path / "bomb.ckpt", members={"weights.npy": bomb}, compression=8)
    assert path.stat().st_size < 2**20
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError, match="compressed"):
            load_checkpoint(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * 2**20


def _load_in_thread(path: Path) -> BaseException | None:
    """Load `path` on a daemon thread; fail the test if it is still blocked after 30 s."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            load_checkpoint(path)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive(), f"loading {path} blocked"
    return outcome[0]


def test_special_files_are_refused_on_load_without_blocking(tmp_path: Path) -> None:
    zero = tmp_path / "zero.ckpt"
    zero.symlink_to("/dev/zero")
    assert isinstance(_load_in_thread(zero), CheckpointError)
    fifo = tmp_path / "fifo.ckpt"
    os.mkfifo(fifo)
    assert isinstance(_load_in_thread(fifo), CheckpointError)


def test_a_directory_is_refused_on_load_and_named_so(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="a directory, not a checkpoint file"):
        load_checkpoint(tmp_path)


def test_a_symlink_to_a_regular_checkpoint_still_loads(tmp_path: Path) -> None:
    real = _craft(tmp_path / "real.ckpt")
    link = tmp_path / "link.ckpt"
    link.symlink_to(real)
    assert load_checkpoint(link).step == 3


def _ckpt() -> Checkpoint:
    return Checkpoint(model={}, weights=np.zeros(N, np.float32), step=1)


def test_save_refuses_to_replace_symlinks_and_fifos(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    link = tmp_path / "link.ckpt"
    link.symlink_to(victim)
    with pytest.raises(CheckpointError, match="not a regular file"):
        save_checkpoint(link, _ckpt())
    assert link.is_symlink() and victim.read_text() == "keep"
    device = tmp_path / "null.ckpt"
    device.symlink_to("/dev/null")
    with pytest.raises(CheckpointError, match="not a regular file"):
        save_checkpoint(device, _ckpt())
    assert device.is_symlink()
    fifo = tmp_path / "fifo.ckpt"
    os.mkfifo(fifo)
    with pytest.raises(CheckpointError, match="not a regular file"):
        save_checkpoint(fifo, _ckpt())
    assert not list(tmp_path.glob(".*.tmp"))


def test_stale_temp_files_of_our_naming_are_cleaned_on_the_next_save(tmp_path: Path) -> None:
    path = tmp_path / "model.ckpt"
    stale = [tmp_path / f".model.ckpt.{tag}.tmp" for tag in ("abcd_123", "zz9y8x7w")]
    for tmp in stale:
        tmp.write_bytes(b"x" * 1000)
    kept = [
        tmp_path / ".model.ckpt.notours.tmp",  # not mkstemp's 8 characters
        tmp_path / ".other.ckpt.abcd_123.tmp",  # another checkpoint's
        tmp_path / "model.ckpt.abcd_123.tmp",  # no leading dot
    ]
    for other in kept:
        other.write_bytes(b"y")
    save_checkpoint(path, _ckpt())
    assert not any(tmp.exists() for tmp in stale)
    assert all(other.exists() for other in kept)
    assert load_checkpoint(path).step == 1


async def test_a_trainer_keeps_its_state_when_a_hostile_load_fails(
    actor_system: ActorSystem, tmp_path: Path
) -> None:
    config = TrainerConfig(OptimizerKind.adam(0.01), LossKind.CROSS_ENTROPY)
    trainer = await Trainer.spawn(actor_system, Mlp([4, 8, 3], seed=1), "cpu:0", config)
    good = tmp_path / "good.ckpt"
    await trainer.ask(SaveCheckpoint(good), timeout=30)
    saved = load_checkpoint(good)
    before = await trainer.ask(GetWeights(), timeout=30)

    def variant(**changes: Any) -> Checkpoint:
        fields = {**saved.__dict__, **changes}
        return Checkpoint(**fields)

    hostile = {
        "negative second moment": variant(
            optimizer={**saved.optimizer, "exp_avg_sq": np.full(before.size, -1.0, np.float32)}
        ),
        "optimizer step -1": variant(optimizer={**saved.optimizer, "step": -1}),
        "lr 1e39": variant(optimizer={**saved.optimizer, "kind": {"name": "adam", "lr": 1e39}}),
        "NaN weights": variant(weights=np.full(before.size, np.nan, np.float32)),
        "raw-byte weights": variant(weights=np.frombuffer(before.tobytes(), np.uint8)),
    }
    for what, ckpt in hostile.items():
        bad = tmp_path / "bad.ckpt"
        save_checkpoint(bad, ckpt)
        with pytest.raises(CheckpointError):
            await trainer.ask(LoadCheckpoint(bad), timeout=30)
        np.testing.assert_array_equal(await trainer.ask(GetWeights(), timeout=30), before, what)
        again = tmp_path / "again.ckpt"
        await trainer.ask(SaveCheckpoint(again), timeout=30)
        after = load_checkpoint(again)
        assert after.step == saved.step, what
        for key, value in saved.optimizer.items():
            np.testing.assert_array_equal(after.optimizer[key], value, what)


STRATEGIES: dict[str, tuple[Any, Any, int]] = {
    "single": (Trainer, None, 1),
    "data": (DataParallelTrainer, DataParallelOptions(collective="ring"), 2),
    "tensor": (TensorParallelTrainer, None, 2),
    "pipeline": (PipelineParallelTrainer, PipelineOptions(micro_batch_size=8), 2),
    "ps": (
        AsyncParameterServer,
        ParameterServerOptions(workers=1, consistency=Consistency.synchronous()),
        1,
    ),
}


@pytest.mark.parametrize("strategy", list(STRATEGIES))
async def test_every_trainer_answers_a_bad_load_with_a_checkpoint_error_and_keeps_its_state(
    strategy: str, tmp_path: Path
) -> None:
    trainer_class, options, n = STRATEGIES[strategy]
    config = TrainerConfig(OptimizerKind.adam(0.01), LossKind.CROSS_ENTROPY)
    x, y = synthetic_classification(32, 6, 3, seed=5)
    async with ActorSystem("hostile") as system:
        model = Mlp([6, 8, 3], seed=1)
        ref = await trainer_class.spawn(system, model, cpu_devices(n), config, options)
        await ref.ask(Step(x, y), timeout=30)
        good = tmp_path / "good.ckpt"
        await ref.ask(SaveCheckpoint(good), timeout=30)
        saved = load_checkpoint(good)
        before = await ref.ask(GetWeights(), timeout=30)
        hostile = {
            "kind not a dict": {"optimizer": {**saved.optimizer, "kind": 5}},
            "no optimizer state": {"optimizer": {}},
            "buffer not an array": {"optimizer": {**saved.optimizer, "exp_avg": "abc"}},
            "negative second moment": {
                "optimizer": {**saved.optimizer, "exp_avg_sq": -np.ones(before.size, np.float32)}
            },
            "micro not a number": {"extra": {**saved.extra, "micro": "x"}},
            "micro a list": {"extra": {**saved.extra, "micro": [3]}},
            "lr beyond float's range": {
                "optimizer": {**saved.optimizer, "kind": {**saved.optimizer["kind"], "lr": 10**400}}
            },
            "a size beyond float's range": {"model": {**saved.model, "sizes": [6, 10**400, 3]}},
        }
        for what, changes in hostile.items():
            bad = tmp_path / "bad.ckpt"
            save_checkpoint(bad, Checkpoint(**{**saved.__dict__, **changes}))
            with pytest.raises(CheckpointError):
                await ref.ask(LoadCheckpoint(bad), timeout=30)
            np.testing.assert_array_equal(await ref.ask(GetWeights(), timeout=30), before, what)
            again = tmp_path / "again.ckpt"
            await ref.ask(SaveCheckpoint(again), timeout=30)
            after = load_checkpoint(again)
            assert after.step == saved.step, what
            for key, value in saved.optimizer.items():
                np.testing.assert_array_equal(after.optimizer[key], value, what)
        await ref.stop()
