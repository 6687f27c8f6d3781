"""Checkpoint files: round trip, atomic replace, corruption and truncation."""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atomr.train import CheckpointError, load_checkpoint
from atomr.train.core import Checkpoint, save_checkpoint
from atomr.train.core.checkpoint import check_model_matches, restored_optimizer
from atomr.train.core.optimizer import OptimizerKind


def _ckpt(seed: int = 0, n: int = 50) -> Checkpoint:
    rng = np.random.default_rng(seed)
    return Checkpoint(
        model={"sizes": [4, 6, 2], "activation": "relu"},
        weights=rng.standard_normal(n).astype(np.float32),
        step=7 + seed,
        optimizer={
            "kind": {"name": "adam", "lr": 0.1},
            "step": 7,
            "exp_avg": rng.standard_normal(n).astype(np.float32),
        },
        extra={"micro": 1, "accum": np.arange(3, dtype=np.float64)},
    )


def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "a.ckpt"
    ckpt = _ckpt()
    save_checkpoint(path, ckpt)
    back = load_checkpoint(path)
    assert back.model == ckpt.model and back.step == ckpt.step
    np.testing.assert_array_equal(back.weights, ckpt.weights)
    assert back.weights.dtype == np.float32
    np.testing.assert_array_equal(back.optimizer["exp_avg"], ckpt.optimizer["exp_avg"])
    assert back.optimizer["kind"] == ckpt.optimizer["kind"] and back.optimizer["step"] == 7
    assert back.extra["micro"] == 1
    np.testing.assert_array_equal(back.extra["accum"], np.arange(3.0))
    assert [p.name for p in tmp_path.iterdir()] == ["a.ckpt"]  # no temporary left


def test_crash_mid_save_leaves_previous_checkpoint(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "a.ckpt"
    save_checkpoint(path, _ckpt(0))
    before = path.read_bytes()

    def crash(src, dst):  # the process dies between writing and renaming
        raise OSError("simulated crash")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="simulated crash"):
        save_checkpoint(path, _ckpt(1))
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert load_checkpoint(path).step == 7
    assert [p.name for p in tmp_path.iterdir()] == ["a.ckpt"]


def test_a_file_system_refusing_the_mode_leaks_no_descriptor(tmp_path: Path, monkeypatch) -> None:
    """`os.fchmod` refused (a file system without modes): the save fails with
    the file system's error, the previous checkpoint stays, and the temporary
    file's descriptor is closed (it was left open before)."""
    path = tmp_path / "a.ckpt"
    save_checkpoint(path, _ckpt(0))
    before, fds = path.read_bytes(), len(os.listdir("/proc/self/fd"))

    def refuse(fd: int, mode: int) -> None:
        raise PermissionError("chmod refused")

    monkeypatch.setattr(os, "fchmod", refuse)
    with pytest.raises(PermissionError, match="chmod refused"):
        save_checkpoint(path, _ckpt(1))
    monkeypatch.undo()
    assert len(os.listdir("/proc/self/fd")) == fds
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["a.ckpt"]


def test_crash_mid_write_leaves_previous_checkpoint(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "a.ckpt"
    save_checkpoint(path, _ckpt(0))
    before = path.read_bytes()
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError("disk gone")))
    with pytest.raises(OSError, match="disk gone"):
        save_checkpoint(path, _ckpt(1))
    monkeypatch.undo()
    assert path.read_bytes() == before


@pytest.mark.parametrize("cut", [1, 33, 500, -1])
def test_truncated_file_is_detected(tmp_path: Path, cut: int) -> None:
    path = tmp_path / "a.ckpt"
    save_checkpoint(path, _ckpt())
    data = path.read_bytes()
    path.write_bytes(data[:cut])  # cut -1: all but the last byte
    with pytest.raises(CheckpointError):
        load_checkpoint(path)


def test_flipped_bytes_are_detected(tmp_path: Path) -> None:
    path = tmp_path / "a.ckpt"
    save_checkpoint(path, _ckpt())
    data = bytearray(path.read_bytes())
    for pos in (20, len(data) // 2, len(data) - 40):
        bad = bytearray(data)
        bad[pos] ^= 0x01
        path.write_bytes(bytes(bad))
        with pytest.raises(CheckpointError, match="checksum"):
            load_checkpoint(path)


def _with_header(raw: bytes, text: bytes, seal: bool = True) -> bytes:
    """The checkpoint file `raw` with `text` as its header, resealed (its
    checksum recomputed) or not."""
    header_len = int.from_bytes(raw[8:16], "little")
    body = raw[:8] + len(text).to_bytes(8, "little") + text + raw[16 + header_len : -32]
    return body + (hashlib.sha256(body).digest() if seal else raw[-32:])


def test_a_header_that_is_not_json_is_refused_after_the_checksum(tmp_path: Path) -> None:
    path = tmp_path / "a.ckpt"
    save_checkpoint(path, _ckpt())
    raw = path.read_bytes()
    path.write_bytes(_with_header(raw, b'{"model": [', seal=False))  # a bit flip says so
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        load_checkpoint(path)
    for text in (b'{"model": [', b"\xff{}", b"[" * 10**5):
        path.write_bytes(_with_header(raw, text))
        with pytest.raises(CheckpointError, match=f"^{re.escape(str(path))}: header is not JSON"):
            load_checkpoint(path)


def test_a_header_is_decoded_once_per_load(tmp_path: Path, monkeypatch) -> None:
    """Its `payload_len`, checked before the payload is read, came from a
    first decoding, and its fields from a second one."""
    path = tmp_path / "a.ckpt"
    save_checkpoint(path, _ckpt())
    decoded: list[str] = []
    decode = json.JSONDecoder.decode

    def counting(self: json.JSONDecoder, text: str, *args: Any, **kwargs: Any) -> Any:
        decoded.append(text)
        return decode(self, text, *args, **kwargs)

    monkeypatch.setattr(json.JSONDecoder, "decode", counting)
    assert load_checkpoint(path).step == 7
    assert len(decoded) == 1


def test_not_a_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "x.npz"
    np.savez(path, weights=np.zeros(3))
    with pytest.raises(CheckpointError, match="not an atomr checkpoint"):
        load_checkpoint(path)
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "missing")


def test_unstorable_state_is_refused(tmp_path: Path) -> None:
    ckpt = _ckpt()
    ckpt.extra["obj"] = np.array([object()], dtype=object)
    with pytest.raises(CheckpointError, match="pickle"):
        save_checkpoint(tmp_path / "a", ckpt)
    ckpt = _ckpt()
    ckpt.extra["fn"] = print
    with pytest.raises(CheckpointError, match="JSON"):
        save_checkpoint(tmp_path / "a", ckpt)
    assert not list(tmp_path.iterdir())


def test_check_model_matches() -> None:
    ckpt = _ckpt()
    check_model_matches(ckpt, {"sizes": [4, 6, 2], "activation": "relu"}, 50, np.float32)
    with pytest.raises(CheckpointError, match="model"):
        check_model_matches(ckpt, {"sizes": [4, 7, 2], "activation": "relu"}, 50, np.float32)
    with pytest.raises(CheckpointError, match="model"):
        check_model_matches(ckpt, {"sizes": [4, 6, 2], "activation": "tanh"}, 50, np.float32)
    with pytest.raises(CheckpointError, match="parameters"):
        check_model_matches(ckpt, {"sizes": [4, 6, 2], "activation": "relu"}, 51, np.float32)


def test_check_model_matches_refuses_weights_wider_than_the_receiving_dtype() -> None:
    """The dtype held is given, not read from the config: a config naming
    none (a parameter server's default) skipped the check, so float64
    weights were rounded into a float32 model; float32 ones widen exactly."""
    ckpt = _ckpt()
    ckpt.weights = ckpt.weights.astype(np.float64)
    config = {"sizes": [4, 6, 2], "activation": "relu"}  # no "dtype"
    with pytest.raises(CheckpointError, match="weights are float64, this model is float32"):
        check_model_matches(ckpt, config, 50, np.float32)
    with pytest.raises(CheckpointError, match="would round them"):
        check_model_matches(ckpt, {**config, "dtype": "float64"}, 50, np.float32)
    check_model_matches(ckpt, config, 50, np.float64)
    check_model_matches(_ckpt(), config, 50, np.float64)


def test_check_model_matches_compares_activate_last_absent_meaning_false() -> None:
    """activate_last was not compared: a checkpoint of an Mlp activating its
    output loaded into one that does not (the same parameter count)."""
    ckpt = _ckpt()  # its model config has no activate_last: a checkpoint older than it
    plain = {"sizes": [4, 6, 2], "activation": "relu", "activate_last": False}
    activated = {**plain, "activate_last": True}
    check_model_matches(ckpt, plain, 50, np.float32)
    check_model_matches(ckpt, {"sizes": [4, 6, 2], "activation": "relu"}, 50, np.float32)
    with pytest.raises(
        CheckpointError, match="activate_last=False, this model has activate_last=True"
    ):
        check_model_matches(ckpt, activated, 50, np.float32)
    ckpt.model = dict(activated)
    check_model_matches(ckpt, activated, 50, np.float32)
    with pytest.raises(
        CheckpointError, match="activate_last=True, this model has activate_last=False"
    ):
        check_model_matches(ckpt, plain, 50, np.float32)
    ckpt.model = {**plain, "activate_last": "false"}  # a hostile file: not False
    with pytest.raises(CheckpointError, match="activate_last='false'"):
        check_model_matches(ckpt, plain, 50, np.float32)


def test_save_into_a_missing_directory_names_the_directory(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such"
    with pytest.raises(FileNotFoundError, match="directory") as info:
        save_checkpoint(missing / "a.ckpt", _ckpt())
    assert info.value.filename == str(missing)
    assert not missing.exists()


def test_save_under_a_file_says_it_is_no_directory(tmp_path: Path) -> None:
    # it exists: "directory does not exist" would send the user looking for it
    file = tmp_path / "a-file"
    file.write_bytes(b"x")
    with pytest.raises(NotADirectoryError, match="is not a directory") as info:
        save_checkpoint(file / "a.ckpt", _ckpt())
    assert info.value.filename == str(file)
    assert file.read_bytes() == b"x"


def test_object_weights_are_refused(tmp_path: Path) -> None:
    ckpt = _ckpt()
    ckpt.weights = np.array([object()] * 3, dtype=object)
    with pytest.raises(CheckpointError, match="pickle"):
        save_checkpoint(tmp_path / "a", ckpt)
    assert not list(tmp_path.iterdir())


def test_check_model_matches_refuses_non_numeric_weights() -> None:
    ckpt = _ckpt()
    ckpt.weights = np.array(["a"] * 50)
    with pytest.raises(CheckpointError, match="dtype"):
        check_model_matches(ckpt, {"sizes": [4, 6, 2], "activation": "relu"}, 50, np.float32)


def test_restored_optimizer_holds_the_saved_state_or_refuses_naming_its_owner() -> None:
    saved = OptimizerKind.adam(0.01).create(4)
    saved.step(np.ones(4, np.float32), np.ones(4, np.float32))
    state = saved.state_dict()
    restored = restored_optimizer(OptimizerKind.adam(0.01), 4, state)
    assert restored.step_count == 1
    buffers = [k for k in state if k not in ("kind", "step")]
    assert buffers
    for key in buffers:
        np.testing.assert_array_equal(restored.state_dict()[key], state[key])
    with pytest.raises(CheckpointError, match=r"^stage 1: optimizer state does not fit"):
        restored_optimizer(OptimizerKind.sgd(0.1), 4, state, owner="stage 1")  # another kind
    with pytest.raises(CheckpointError, match="does not fit"):
        restored_optimizer(OptimizerKind.adam(0.01), 5, state)  # another size
    with pytest.raises(CheckpointError, match="does not fit"):
        restored_optimizer(OptimizerKind.adam(0.01), 4, "not a dict")  # type: ignore[arg-type]


def test_a_saved_checkpoint_has_the_modes_a_user_expects(tmp_path: Path) -> None:
    """A new file follows the umask, a replaced one keeps its own mode; both
    were always 0600 (mkstemp's)."""
    old = os.umask(0o022)
    try:
        path = tmp_path / "a.ckpt"
        save_checkpoint(path, _ckpt())
        assert path.stat().st_mode & 0o777 == 0o644
        path.chmod(0o640)
        save_checkpoint(path, _ckpt(seed=1))
        assert path.stat().st_mode & 0o777 == 0o640
        assert load_checkpoint(path).step == _ckpt(seed=1).step
    finally:
        os.umask(old)


def test_two_saves_of_one_path_at_once_both_succeed(tmp_path: Path, monkeypatch) -> None:
    """Two trainers saving the same file at once: the second save took the
    first one's temporary file for one a killed save had left, removed it,
    and the first failed with FileNotFoundError at its rename."""
    path = tmp_path / "same.ckpt"
    writing, go_on = threading.Event(), threading.Event()
    fsync = os.fsync
    first = threading.get_ident()

    def held_fsync(fd: int) -> None:  # the first save stops mid-write until told
        if threading.get_ident() == first and not go_on.is_set():
            writing.set()
            go_on.wait()
        fsync(fd)

    monkeypatch.setattr(os, "fsync", held_fsync)
    errors: list[BaseException] = []

    def second_save() -> None:
        writing.wait()
        try:
            save_checkpoint(path, _ckpt(seed=2))
        except BaseException as error:  # reported below
            errors.append(error)
        finally:
            go_on.set()

    other = threading.Thread(target=second_save)
    other.start()
    try:
        save_checkpoint(path, _ckpt(seed=1))
    finally:
        writing.set()
        go_on.set()
        other.join()
    assert errors == []
    assert load_checkpoint(path).step == _ckpt(seed=1).step  # the later rename won
    assert [p.name for p in tmp_path.iterdir()] == ["same.ckpt"]


def test_a_temporary_file_a_killed_save_left_is_removed_by_the_next_save(tmp_path: Path) -> None:
    path = tmp_path / "a.ckpt"
    left = tmp_path / ".a.ckpt.k1ll3d_x.tmp"
    left.write_bytes(b"half a checkpoint")
    other = tmp_path / ".b.ckpt.k1ll3d_x.tmp"  # another file's: left alone
    other.write_bytes(b"x")
    save_checkpoint(path, _ckpt())
    assert sorted(p.name for p in tmp_path.iterdir()) == [".b.ckpt.k1ll3d_x.tmp", "a.ckpt"]
