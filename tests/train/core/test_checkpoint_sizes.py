"""A checkpoint that declares sizes it does not hold is refused without
allocating them: an array header declaring 10**15 elements (checked against
the member's bytes), and a model config whose sizes no array could hold."""

from __future__ import annotations

import hashlib
import io
import json
import re
import struct
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest

from atomr._arguments import INDEX_MAX
from atomr.train import CheckpointError, load_checkpoint
from atomr.train.core import Checkpoint, save_checkpoint
from atomr.train.core.checkpoint import MAGIC, pending_micro_steps
from atomr.train.core.models import model_from_config

_MB = 2**20


def _saved(tmp_path: Path, model: dict[str, object]) -> Path:
    path = tmp_path / "c.ckpt"
    weights = np.zeros(10, dtype=np.float32)  # an Mlp([4, 2])'s
    save_checkpoint(path, Checkpoint(model=model, weights=weights, step=0))
    return path


def _hostile(path: Path, shape: tuple[int, ...]) -> None:
    """A checkpoint, well formed down to its checksum and CRCs, whose weights'
    `.npy` header declares `shape` over 40 bytes of data (the file format:
    `atomr.train.core.checkpoint`)."""
    npy = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        npy, {"descr": "<f4", "fortran_order": False, "shape": shape}
    )
    member = npy.getvalue() + bytes(40)
    zipped = io.BytesIO()
    with zipfile.ZipFile(zipped, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("weights.npy", member)
    payload = zipped.getvalue()
    header = json.dumps(
        {
            "model": {"sizes": [4, 2]},
            "step": 0,
            "optimizer": {},
            "extra": {},
            "payload_len": len(payload),
        }  # fmt: skip
    ).encode()
    body = MAGIC + struct.pack("<Q", len(header)) + header + payload
    path.write_bytes(body + hashlib.sha256(body).digest())


def test_an_array_header_declaring_1e15_elements_is_refused_without_allocating(
    tmp_path: Path,
) -> None:
    path = tmp_path / "hostile.ckpt"
    _hostile(path, (10**15,))
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError, match=r"\(1000000000000000,\), which does not match"):
            load_checkpoint(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * _MB
    _hostile(path, (10,))  # the same file declaring what it holds loads
    assert load_checkpoint(path).weights.shape == (10,)


@pytest.mark.parametrize(
    ("sizes", "needle"),
    [
        ([10**30, 2], rf"sizes\[0\] must be <= {INDEX_MAX}"),
        ([4, 10**18, 2], rf"Mlp parameters .* more than the {INDEX_MAX} an array can hold"),
        ([2**40, 2**40], rf"Mlp parameters .* more than the {INDEX_MAX} an array can hold"),
        ([2**20, 2**20], "params has 10 values, the model needs 1099512676352"),
    ],
)
def test_a_model_config_declaring_sizes_it_does_not_hold_is_refused(
    tmp_path: Path, sizes: list[int], needle: str
) -> None:
    path = _saved(tmp_path, {"sizes": sizes, "activation": "relu"})
    ckpt = load_checkpoint(path)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=needle):
            model_from_config(ckpt.model, ckpt.weights)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * _MB


def _peak_of_load(path: Path, needle: str) -> int:
    """Load `path`, expecting a CheckpointError matching `needle`; the peak
    of memory traced meanwhile."""
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError, match=needle):
            load_checkpoint(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak


def test_a_terabyte_of_trailing_bytes_is_refused_unread(tmp_path: Path) -> None:
    path = _saved(tmp_path, {"sizes": [4, 2]})
    with open(path, "r+b") as file:
        file.truncate(10**12)  # sparse: no disk used; a valid checkpoint first
    assert _peak_of_load(path, "larger than its header says") < 16 * _MB


def test_a_payload_beyond_memory_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "c.ckpt"
    size = 10**12  # sparse; more than this machine's memory
    text = b'{"model": {}, "step": 0, "optimizer": {}, "extra": {}, "payload_len": %d}'
    header = text % 0
    for _ in range(3):  # until the payload's length counts its own digits
        header = text % (size - len(MAGIC) - 8 - 32 - len(header))
    with open(path, "wb") as file:
        file.write(MAGIC + struct.pack("<Q", len(header)) + header)
        file.truncate(size)
    assert _peak_of_load(path, "more than this machine's memory") < 16 * _MB


def test_a_header_of_a_terabyte_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "c.ckpt"
    with open(path, "wb") as file:
        file.write(MAGIC + struct.pack("<Q", 10**12))
        file.truncate(2 * 10**12)  # sparse: the header fits in the file
    assert _peak_of_load(path, "more than a header's 67108864 bytes") < 16 * _MB


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"step": INDEX_MAX + 1}, f"step must be <= {INDEX_MAX}, got {INDEX_MAX + 1}"),
        ({"step": -1}, "step must be >= 0, got -1"),
        ({"optimizer": {"step": 2**70}}, f"optimizer.step must be <= {INDEX_MAX}, got {2**70}"),
        ({"optimizer": {"step": True}}, "optimizer.step must be an int, got True"),
    ],
)
def test_a_step_is_a_count_by_the_one_rule_of_sizes(
    tmp_path: Path, fields: dict[str, object], needle: str
) -> None:
    """A checkpoint's counts are refused by `int_at_least`'s rule and words
    (at most `INDEX_MAX`), not by a bound of their own."""
    path = tmp_path / "c.ckpt"
    save_checkpoint(path, Checkpoint(**{"model": {}, "weights": np.zeros(3), "step": 0, **fields}))
    with pytest.raises(CheckpointError, match=f"^{re.escape(f'{path}: {needle}')}$"):
        load_checkpoint(path)


def test_a_count_in_extra_is_refused_by_the_one_rule_of_sizes(tmp_path: Path) -> None:
    path = tmp_path / "c.ckpt"
    extra = {"micro": INDEX_MAX + 1}
    save_checkpoint(path, Checkpoint({}, np.zeros(3), INDEX_MAX, extra=extra))
    ckpt = load_checkpoint(path)  # a step of INDEX_MAX is one
    assert ckpt.step == INDEX_MAX
    with pytest.raises(CheckpointError, match=rf"^extra\.micro must be <= {INDEX_MAX}, got"):
        pending_micro_steps(ckpt)
    ckpt.extra["micro"] = np.int64(INDEX_MAX)
    assert pending_micro_steps(ckpt) == INDEX_MAX
