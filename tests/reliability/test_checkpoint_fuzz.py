"""Fuzzed checkpoint files: a valid save of every strategy (float32 and
float64), damaged at random.

A damaged file (truncated, a bit flipped, its checksum left as it was) must
be a `CheckpointError`. A hostile one (its checksum recomputed around a
mutated header, array member or archive) may load, when what it says is
still a valid checkpoint; loaded, the trainer must hold exactly what it
says, and refused (`CheckpointError`, or `OSError` for a file that is not
there), the trainer's weights, step and optimizer state must be unchanged.
Nothing may allocate from a declared size, and nothing may hang.

`ATOMR_FUZZ_EXAMPLES` raises the example count when hunting (CI: a few).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import io
import json
import os
import threading
import tracemalloc
import warnings
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from atomr import ActorRef, ActorSystem
from atomr.accel import cpu_devices
from atomr.train import (
    CheckpointError,
    GetWeights,
    LoadCheckpoint,
    Mlp,
    OptimizerKind,
    SaveCheckpoint,
    ShardedDataParallelTrainer,
    ShardedOptions,
    Step,
    TrainerConfig,
    load_checkpoint,
)
from atomr.train.core import Checkpoint, save_checkpoint, synthetic_classification
from atomr.train.core.checkpoint import MAGIC, checkpoint_digest
from atomr.train.core.sharded_index import merge_shards, save_digest
from tests.train.test_contract import CONFIG, STRATEGIES

EXAMPLES = int(os.environ.get("ATOMR_FUZZ_EXAMPLES", "0"))


def _fuzz(examples: int) -> settings:
    return settings(
        max_examples=EXAMPLES or examples,
        deadline=None,
        derandomize=not EXAMPLES,
        suppress_health_check=list(HealthCheck),
    )


WINDOW = dataclasses.replace(CONFIG, accumulation_steps=2)  # saved inside an open window
SGD = dataclasses.replace(CONFIG, optimizer=OptimizerKind.sgd(0.1, momentum=0.9))
ALL: dict[str, tuple[Any, Any, int, TrainerConfig]] = {
    **{name: (*spawn, CONFIG) for name, spawn in STRATEGIES.items()},
    "zero-files": (
        ShardedDataParallelTrainer,
        ShardedOptions(stage=1, shard_checkpoints=True),
        2,
        CONFIG,
    ),
    "single-window": (*STRATEGIES["single"], WINDOW),
    "data-window": (*STRATEGIES["data"], WINDOW),
    "data-sgd": (*STRATEGIES["data"], SGD),
}
DTYPES = {"f32": np.float32, "f64": np.float64}
X, Y = synthetic_classification(16, 4, 3, seed=3)
PEAK = 8 * 2**20  # far below any size a mutation declares or inflates to


@dataclass
class Saved:
    """A valid save: its files' bytes (the index first) and what it loads as."""

    files: dict[str, bytes]
    ckpt: Checkpoint


async def _save(system: ActorSystem, strategy: str, dtype: Any, folder: Path) -> Saved:
    trainer_class, options, n, config = ALL[strategy]
    model = Mlp([4, 5, 3], seed=1, dtype=dtype)
    ref = await trainer_class.spawn(system, model, cpu_devices(n), config, options)
    await ref.ask(Step(X, Y), timeout=30)
    folder.mkdir()
    await ref.ask(SaveCheckpoint(folder / "c.ckpt"), timeout=30)
    await ref.stop()
    names = sorted(p.name for p in folder.iterdir())
    names.remove("c.ckpt")
    files = {name: (folder / name).read_bytes() for name in ["c.ckpt", *names]}
    return Saved(files, merge_shards(folder / "c.ckpt"))


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Saved]:
    """A valid save of every strategy in every dtype."""
    root = tmp_path_factory.mktemp("saves")

    async def run() -> dict[tuple[str, str], Saved]:
        async with ActorSystem("fuzz-saves") as system:
            return {
                (s, d): await _save(system, s, dtype, root / f"{s}-{d}")
                for s in ALL
                for d, dtype in DTYPES.items()
            }

    return asyncio.run(run())


# ------------------------------------------------------------- taking files apart


@dataclass
class Parts:
    """A checkpoint file taken apart: its header's JSON and its members."""

    header: dict[str, Any]
    members: list[tuple[str, bytes]]
    compress: dict[str, int]


def _split(raw: bytes) -> Parts:
    header_len = int.from_bytes(raw[8:16], "little")
    header = json.loads(raw[16 : 16 + header_len])
    with zipfile.ZipFile(io.BytesIO(raw[16 + header_len : -32])) as archive:
        members = [(info.filename, archive.read(info)) for info in archive.infolist()]
    return Parts(header, members, {})


def _join(parts: Parts, fix_payload_len: bool = True) -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # duplicated names are one of the mutations
        with zipfile.ZipFile(buf, "w") as archive:
            for name, data in parts.members:
                compression = parts.compress.get(name, zipfile.ZIP_STORED)
                archive.writestr(name, data, compress_type=compression)
    payload = buf.getvalue()
    header = dict(parts.header)
    if fix_payload_len:
        header["payload_len"] = len(payload)
    text = json.dumps(header).encode()
    return _sealed(MAGIC + len(text).to_bytes(8, "little") + text + payload)


def _sealed(body: bytes) -> bytes:
    return body + hashlib.sha256(body).digest()


def _paths(value: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place inside a JSON value, its root excluded."""
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, inner in items:
        yield (*at, key)
        if isinstance(inner, dict | list) and inner:
            yield from _paths(inner, (*at, key))


def _npy(dtype: str, shape: Any, fortran: bool, data: bytes) -> bytes:
    return _npy_text(repr({"descr": dtype, "fortran_order": fortran, "shape": shape}), data)


def _npy_text(header: str, data: bytes) -> bytes:
    """A `.npy` member of format 1.0 with `header` as its header's text."""
    text = header.encode()
    text += b" " * (-(len(text) + 11) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text + data


def _npy_data(member: bytes) -> bytes:
    length = int.from_bytes(member[8:10], "little")
    return member[10 + length :]


# ------------------------------------------------------------- mutations

HOSTILE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.sampled_from([10**400, -(10**400), 2**63, 2**64, -1, 0, 1, 10**12, 2**31]),
    st.floats(),
    st.sampled_from(["", "x", "float64", "float16", "<f8", "adam", "sgd", "relu", "sharded"]),
    st.sampled_from(["x" * 10**5, json.loads("[" * 40 + "]" * 40)]),  # long, deep
    st.lists(st.integers(-3, 10**12), max_size=4),
    st.lists(st.lists(st.integers(-3, 40), min_size=2, max_size=2), max_size=3),
    st.dictionaries(
        st.sampled_from(["count", "n_params", "generation", "name", "lr"]),
        st.integers(-2, 50),
        max_size=3,
    ),
)
CASTS = ["<f2", "<f4", "<f8", ">f8", "<i8", "<u1", "|b1", "<i2"]
DTYPE_NAMES = [
    "<f4",
    "<f8",
    "<f2",
    ">f4",
    "|b1",
    "<i8",
    "<u1",
    "<c8",
    "|O",
    "|V8",
    "<M8[s]",
    "|S4",
    "<U1",
]
NAMES = ["weights.npy", "optimizer/exp_avg.npy", "optimizer/x.npy", "extra/micro.npy",
         "extra/owned.npy", "weights", "../weights.npy", "evil.pkl", "optimizer/exp_avg_sq.npy"]  # fmt: skip


@st.composite
def hostile_bytes(draw: st.DrawFn, raw: bytes, others: list[bytes]) -> bytes:
    """`raw` with one mutation; its checksum recomputed unless the mutation
    is to the bytes themselves (the checksum must then refuse it)."""
    kind = draw(
        st.sampled_from(
            ["truncate", "flip", "flip-sealed", "header", "member", "header-len", "swap"]
        )
    )
    if kind == "truncate":
        return raw[: draw(st.integers(0, len(raw) - 1))]
    if kind in ("flip", "flip-sealed"):
        at = draw(st.integers(0, len(raw) - (33 if kind == "flip-sealed" else 1)))
        flipped = bytearray(raw)
        flipped[at] ^= 1 << draw(st.integers(0, 7))
        return _sealed(bytes(flipped[:-32])) if kind == "flip-sealed" else bytes(flipped)
    if kind == "header-len":
        declared = draw(st.sampled_from([0, 1, 2**63, 2**64 - 1, len(raw)]))
        return _sealed(raw[:8] + declared.to_bytes(8, "little") + raw[16:-32])
    parts = _split(raw)
    if kind == "swap":  # another save's member or header in its place
        other = _split(draw(st.sampled_from(others)))
        if draw(st.booleans()):
            parts.header = other.header
        else:
            parts.members = other.members
        return _join(parts, fix_payload_len=True)
    if kind == "header":
        _mutate_header(draw, parts)
        return _join(parts, fix_payload_len=draw(st.booleans()))
    _mutate_member(draw, parts)
    return _join(parts)


def _mutate_header(draw: st.DrawFn, parts: Parts) -> None:
    places = list(_paths(parts.header))
    place = draw(st.sampled_from(places))
    *outer, key = place
    holder: Any = parts.header
    for step in outer:
        holder = holder[step]
    op = draw(st.sampled_from(["set", "delete", "add"]))
    if op == "delete":
        del holder[key]
    elif op == "add" and isinstance(holder, dict):
        holder[draw(st.sampled_from(["sharded", "micro", "owned", "kind", "step", "zz"]))] = draw(
            HOSTILE
        )
    else:
        holder[key] = draw(HOSTILE)


def _mutate_member(draw: st.DrawFn, parts: Parts) -> None:
    members = parts.members
    i = draw(st.integers(0, len(members) - 1))
    name, data = members[i]
    ops = ["delete", "duplicate", "rename", "npy", "truncate", "flip", "bomb", "cast", "scale"]
    op = draw(st.sampled_from(ops))
    if op == "delete":
        del members[i]
    elif op == "duplicate":
        members.insert(i, (name, data))
    elif op == "rename":
        members[i] = (draw(st.sampled_from(NAMES + [m for m, _ in members])), data)
    elif op == "npy":
        dtype = draw(st.sampled_from(DTYPE_NAMES))
        count = len(_npy_data(data)) // 4
        shape = draw(
            st.sampled_from(
                [(count,), (10**12,), (), (0,), (count, 1), (-1,), (0, 2**62, 2**62), (count // 2,)]
            )
        )
        members[i] = (name, _npy(dtype, shape, draw(st.booleans()), _npy_data(data)))
    elif op == "truncate":
        members[i] = (name, data[: draw(st.integers(0, len(data) - 1))])
    elif op == "flip":
        at = draw(st.integers(0, len(data) - 1))
        flipped = bytearray(data)
        flipped[at] ^= 1 << draw(st.integers(0, 7))
        members[i] = (name, bytes(flipped))
    elif op in ("cast", "scale"):  # the same values in another dtype, or scaled
        array = np.lib.format.read_array(io.BytesIO(data), allow_pickle=False)
        if op == "cast":
            array = array.astype(draw(st.sampled_from(CASTS)))
        else:
            with np.errstate(over="ignore"):  # to infinity in float32: one of the cases
                array = array * draw(st.sampled_from([-1.0, 0.0, 1e30, 1e-30, 1e300]))
        buf = io.BytesIO()
        np.lib.format.write_array(buf, array, allow_pickle=False)
        members[i] = (name, buf.getvalue())
    else:  # a small archive that inflates huge
        members[i] = (name, _npy("<f4", (2**22,), False, bytes(2**24)))
        parts.compress[name] = zipfile.ZIP_DEFLATED


# ------------------------------------------------------------- the file alone


def _load_bounded(path: Path) -> Checkpoint | BaseException:
    """`load_checkpoint(path)`, or the error it raised; its peak memory checked."""
    tracemalloc.start()
    try:
        return load_checkpoint(path)
    except (CheckpointError, OSError) as exc:
        return exc
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak < PEAK, f"loading {path} took {peak} bytes"


SPECIAL = ["fifo", "directory", "/dev/zero", "dangling link", "link loop", "missing", "good link"]
"""What may stand in a file's place: every one but a link to a good copy is refused."""


@st.composite
def damaged_save(draw: st.DrawFn, save: Saved, others: list[bytes]) -> tuple[str, str, bytes]:
    """(which file, how, its new bytes) of one mutation of one file of `save`:
    `how` is "raw" (the checksum refuses it), "hostile" or one of `SPECIAL`."""
    name = draw(st.sampled_from(list(save.files)))
    raw = save.files[name]
    how = draw(st.sampled_from(["raw", "hostile", "hostile", "special"]))
    if how == "special":
        return name, draw(st.sampled_from(SPECIAL)), raw
    if how == "raw":
        if draw(st.booleans()):
            return name, how, raw[: draw(st.integers(0, len(raw) - 1))]
        at = draw(st.integers(0, len(raw) - 1))
        flipped = bytearray(raw)
        flipped[at] ^= 1 << draw(st.integers(0, 7))
        return name, how, bytes(flipped)
    return name, how, draw(hostile_bytes(raw, others))


def _write(folder: Path, save: Saved, name: str, data: bytes, how: str = "hostile") -> Path:
    """The files of `save` in `folder`, `name`'s replaced by `data` or by
    what `how` names (`SPECIAL`); the path of its index."""
    for entry in folder.iterdir():
        entry.rmdir() if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    for other, content in save.files.items():
        target = folder / other
        if other != name:
            target.write_bytes(content)
        elif how == "fifo":
            os.mkfifo(target)
        elif how == "directory":
            target.mkdir()
        elif how == "/dev/zero":
            target.symlink_to("/dev/zero")
        elif how == "dangling link":
            target.symlink_to(folder / "nowhere")
        elif how == "link loop":
            target.symlink_to(target)
        elif how == "good link":
            (folder / "real").write_bytes(content)
            target.symlink_to(folder / "real")
        elif how != "missing":
            target.write_bytes(data)
    return folder / "c.ckpt"


def _same(a: Checkpoint, b: Checkpoint) -> bool:
    """The same state, bit for bit (dtypes included)."""

    def same_state(x: dict[str, Any], y: dict[str, Any]) -> bool:
        if x.keys() != y.keys():
            return False
        for key, value in x.items():
            other = y[key]
            if isinstance(value, np.ndarray) or isinstance(other, np.ndarray):
                if _bits(value) != _bits(other):
                    return False
            elif json.dumps(value, sort_keys=True) != json.dumps(other, sort_keys=True):
                return False
        return True

    return (
        a.model == b.model
        and a.step == b.step
        and _bits(a.weights) == _bits(b.weights)
        and same_state(a.optimizer, b.optimizer)
        and same_state(a.extra, b.extra)
    )


def _bits(value: Any) -> tuple[str, tuple[int, ...], bytes] | None:
    if not isinstance(value, np.ndarray):
        return None
    return value.dtype.str, value.shape, value.tobytes()


def _merge_bounded(path: Path) -> Checkpoint | BaseException:
    """`merge_shards(path)` (what every trainer reads), or the error it
    raised; its peak memory checked."""
    tracemalloc.start()
    try:
        return merge_shards(path)
    except (CheckpointError, OSError) as exc:
        return exc
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak < PEAK, f"loading {path} took {peak} bytes"


def test_a_damaged_or_hostile_file_is_refused_or_loads_what_it_says(
    saved: dict[tuple[str, str], Saved], tmp_path: Path
) -> None:
    keys = sorted(saved)
    others = [s.files["c.ckpt"] for s in saved.values()]

    @_fuzz(60)
    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        save = saved[data.draw(st.sampled_from(keys))]
        name, how, damaged = data.draw(damaged_save(save, others))
        outcome = _merge_bounded(_write(tmp_path, save, name, damaged, how))
        if how == "raw":  # the checksum refuses it
            assert isinstance(outcome, CheckpointError), outcome
        elif how in SPECIAL and how != "good link":
            assert isinstance(outcome, CheckpointError | OSError), outcome
        elif isinstance(outcome, Checkpoint) and damaged == save.files[name]:
            assert _same(outcome, save.ckpt)
        else:
            assert isinstance(outcome, Checkpoint | CheckpointError | OSError), outcome

    check()


# ------------------------------------------------------------- into a trainer


async def _state(ref: ActorRef, folder: Path) -> Checkpoint:
    """The trainer's whole state, as its own save gives it."""
    await ref.ask(SaveCheckpoint(folder / "now.ckpt"), timeout=30)
    return merge_shards(folder / "now.ckpt")


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("strategy", list(ALL))
def test_a_trainer_loads_what_a_hostile_file_says_or_refuses_it_unchanged(
    strategy: str, dtype: str, saved: dict[tuple[str, str], Saved], tmp_path: Path
) -> None:
    save = saved[strategy, dtype]
    others = [s.files["c.ckpt"] for s in saved.values()]
    good, files, own = tmp_path / "good", tmp_path / "files", tmp_path / "own"
    for folder in (good, files, own):
        folder.mkdir()
    good_path = _write(good, save, "c.ckpt", save.files["c.ckpt"])
    trainer_class, options, n, config = ALL[strategy]
    with asyncio.Runner() as runner:
        system = ActorSystem("fuzz-load")
        runner.run(system.__aenter__())
        try:
            model = Mlp([4, 5, 3], seed=2, dtype=DTYPES[dtype])
            ref = runner.run(trainer_class.spawn(system, model, cpu_devices(n), config, options))
            runner.run(ref.ask(LoadCheckpoint(good_path), timeout=30))
            baseline = runner.run(_state(ref, own))
            weights = runner.run(ref.ask(GetWeights(), timeout=30))

            @_fuzz(6)
            @given(data=st.data())
            def check(data: st.DataObject) -> None:
                name, how, damaged = data.draw(damaged_save(save, others))
                path = _write(files, save, name, damaged, how)
                expected = _merge_bounded(path)
                try:
                    runner.run(ref.ask(LoadCheckpoint(path), timeout=30))
                except (CheckpointError, OSError) as exc:
                    now = runner.run(ref.ask(GetWeights(), timeout=30))
                    assert _bits(now) == _bits(weights), f"weights changed by a refused load: {exc}"
                    assert _same(runner.run(_state(ref, own)), baseline), exc
                    return
                assert isinstance(expected, Checkpoint), f"the trainer loaded {expected!r}"
                now = runner.run(ref.ask(GetWeights(), timeout=30))
                assert _bits(now) == _bits(expected.weights.astype(now.dtype))
                assert runner.run(_state(ref, own)).step == expected.step
                runner.run(ref.ask(LoadCheckpoint(good_path), timeout=30))

            check()
        finally:
            runner.run(system.__aexit__(None, None, None))


# ------------------------------------------------------------- what the fuzz found


def _with_directory_field(folder: Path, at: int, value: int) -> Path:
    """A valid checkpoint whose first zip directory entry has the 2 bytes at
    offset `at` set to `value`, its checksum recomputed."""
    path = folder / "c.ckpt"
    save_checkpoint(path, Checkpoint({}, np.zeros(3, np.float32), 1))
    raw = path.read_bytes()
    i = raw.index(b"PK\x01\x02") + at
    path.write_bytes(_sealed(raw[:i] + value.to_bytes(2, "little") + raw[i + 2 : -32]))
    return path


@pytest.mark.parametrize(
    ("at", "value", "error"),
    [
        (6, 109, "not a zip archive: zip file version 10.9"),  # NotImplementedError before
        (8, 0x01, "'weights.npy' is encrypted"),  # RuntimeError before
        (8, 0x20, "'weights.npy' is encrypted"),  # NotImplementedError before (patched data)
        (8, 0x40, "'weights.npy' is encrypted"),  # NotImplementedError before (strong)
    ],
)
def test_a_payload_of_a_zip_feature_the_reader_lacks_is_a_checkpoint_error(
    tmp_path: Path, at: int, value: int, error: str
) -> None:
    with pytest.raises(CheckpointError, match=error):
        load_checkpoint(_with_directory_field(tmp_path, at, value))


@pytest.mark.parametrize(
    "header",
    [
        "{'descr': '<f4', 'fortran_order': False, 'shape': (3,}",  # TokenError before
        "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), '''",  # TokenError before
    ],
)
def test_an_array_header_numpy_cannot_tokenize_is_a_checkpoint_error(
    tmp_path: Path, header: str
) -> None:
    path = tmp_path / "c.ckpt"
    save_checkpoint(path, Checkpoint({}, np.zeros(3, np.float32), 1))
    parts = _split(path.read_bytes())
    parts.members = [("weights.npy", _npy_text(header, bytes(12)))]
    path.write_bytes(_join(parts))
    with pytest.raises(CheckpointError, match="payload member 'weights.npy' is malformed"):
        load_checkpoint(path)


def test_a_header_nested_deeper_than_32_levels_is_refused_naming_the_field(
    tmp_path: Path,
) -> None:
    """The CLI's comparison of such a schedule with its own was a RecursionError."""
    path = tmp_path / "c.ckpt"
    deep: dict[str, Any] = {"kind": "cosine"}
    for _ in range(32):
        deep = {"kind": "sequential", "schedules": [deep]}
    save_checkpoint(path, Checkpoint({}, np.zeros(3, np.float32), 1, {"kind": {"schedule": deep}}))
    with pytest.raises(CheckpointError, match=r"header\.optimizer\.kind\.schedule\.sch.*32 levels"):
        load_checkpoint(path)


def _digest_in_thread(read: Any) -> BaseException | str:
    """`read()` on a daemon thread: what it returned or raised; fails the
    test if it is still blocked after 30 s."""
    outcome: list[BaseException | str] = []

    def run() -> None:
        try:
            outcome.append(read())
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=30)
    return outcome[0] if outcome else TimeoutError("blocked")


def test_the_digest_of_a_fifo_index_or_shard_is_refused_without_blocking(
    saved: dict[tuple[str, str], Saved], tmp_path: Path
) -> None:
    """`atomr train --resume` of a sharded save read its shard files' digests
    (`save_digest`) before their content, with a blocking open: a FIFO in a
    shard's place hung it."""
    save = saved["zero-files", "f32"]
    shard = [name for name in save.files if "shard" in name][0]
    path = _write(tmp_path, save, shard, b"", "fifo")
    try:
        index = load_checkpoint(path)
        outcome = _digest_in_thread(lambda: save_digest(path, index))
        assert isinstance(outcome, CheckpointError), outcome
        assert "not a regular file" in str(outcome) and shard in str(outcome)
        _write(tmp_path, save, "c.ckpt", b"", "fifo")
        outcome = _digest_in_thread(lambda: checkpoint_digest(path))
        assert isinstance(outcome, CheckpointError), outcome
    finally:  # a reader still blocked in open() is let go
        for fifo in tmp_path.iterdir():
            if fifo.is_fifo():
                with contextlib.suppress(OSError):
                    os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
