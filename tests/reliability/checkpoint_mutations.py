"""Damaging a checkpoint save's files for the fuzz tests
(`test_checkpoint_fuzz.py`, `tests/cli/test_resume_hostile.py`): taking a
file apart into its header and array members, one hypothesis-drawn
mutation of it (its checksum recomputed or not), and writing a save's
files with one replaced, or with a FIFO, directory or link in its place."""

from __future__ import annotations

import hashlib
import io
import json
import os
import warnings
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from atomr.train.core import Checkpoint
from atomr.train.core.checkpoint import MAGIC

EXAMPLES = int(os.environ.get("ATOMR_FUZZ_EXAMPLES", "0"))


def _fuzz(examples: int) -> settings:
    """Hypothesis settings of `examples` examples, derandomized for CI;
    `ATOMR_FUZZ_EXAMPLES` (when hunting) replaces the count, randomized."""
    return settings(
        max_examples=EXAMPLES or examples,
        deadline=None,
        derandomize=not EXAMPLES,
        suppress_health_check=list(HealthCheck),
    )


@dataclass
class Saved:
    """A valid save: its files' bytes (the index first) and what it loads as."""

    files: dict[str, bytes]
    ckpt: Checkpoint


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
