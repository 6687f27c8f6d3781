"""Reading a checkpoint's array archive without trusting it.

A checkpoint's payload is an `np.savez` zip archive. `np.load` would inflate
any compressed member and read every member it is asked for, whatever its
size; here each member is checked from the archive's directory and its `.npy`
header before a byte of its data is copied: stored (not compressed), a name
this format writes, a real-number dtype, and a shape whose size matches the
bytes the member holds. Float arrays must be finite.
"""

from __future__ import annotations

import io
import re
import tokenize
import zipfile

import numpy as np

from atomr.train.core.errors import CheckpointError
from atomr.train.core.validation import cast_finite

__all__ = ["read_members"]

_MEMBER_NAME = re.compile(r"(weights|(?:optimizer|extra)/[A-Za-z0-9_.-]{1,64})\.npy")
_REAL_KINDS = "biuf"
_UNREADABLE_FLAGS = 0x01 | 0x20 | 0x40  # encrypted, patched data, strong encryption
_MALFORMED = (ValueError, OSError, zipfile.BadZipFile, EOFError, SyntaxError, tokenize.TokenError)
"""What reading a malformed member raises (NumPy's `.npy` header parser lets
its tokenizer's and parser's errors through)."""


def read_members(payload: bytes) -> dict[str, np.ndarray]:
    """The arrays of a checkpoint payload, keyed by member name without `.npy`.

    Args:
        payload: the zip archive's bytes.

    Returns:
        One array per member, each a fresh copy.

    Raises:
        CheckpointError: not a zip archive (or one of a zip version or
            feature the reader lacks), a compressed, encrypted, duplicated or
            unexpected member, an array header that is malformed or does not
            match the member's size, a dtype that is not a real number, or a
            float array holding NaN or infinity. The message names the member.
    """
    try:
        archive = zipfile.ZipFile(io.BytesIO(payload))
    except (zipfile.BadZipFile, ValueError, OSError, NotImplementedError) as exc:
        raise CheckpointError(f"payload is not a zip archive: {exc}") from exc
    with archive:
        infos = archive.infolist()
        names = [info.filename for info in infos]
        if len(set(names)) != len(names):
            raise CheckpointError("payload has duplicated members")
        for info in infos:
            _check_entry(info, len(payload))
        return {info.filename[: -len(".npy")]: _read(archive, info) for info in infos}


def _check_entry(info: zipfile.ZipInfo, payload_len: int) -> None:
    """Refuse a member from its directory entry alone, before it is opened."""
    name = info.filename
    if not _MEMBER_NAME.fullmatch(name):
        raise CheckpointError(f"payload member {name!r} is not one this format writes")
    if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size:
        raise CheckpointError(f"payload member {name!r} is compressed (only stored members)")
    if info.flag_bits & _UNREADABLE_FLAGS:
        raise CheckpointError(f"payload member {name!r} is encrypted (only plain stored members)")
    if info.file_size > payload_len:
        raise CheckpointError(f"payload member {name!r} claims more bytes than the payload")


def _read(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> np.ndarray:
    """Check a member's `.npy` header against its size, then read its data."""
    name = info.filename
    try:
        with archive.open(info) as fh:
            version = np.lib.format.read_magic(fh)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
            else:
                raise CheckpointError(f"payload member {name!r} has .npy version {version}")
            if dtype.kind not in _REAL_KINDS or dtype.hasobject or dtype.subdtype is not None:
                raise CheckpointError(f"{name!r} has dtype {dtype}, not a real number")
            count = 1
            for dim in shape:
                count *= dim
            expected = count * dtype.itemsize
            if fh.tell() + expected != info.file_size:
                raise CheckpointError(
                    f"{name!r} header says {dtype} {shape}, which does not match its "
                    f"{info.file_size} bytes"
                )
            data = fh.read(expected)
            if len(data) != expected:
                raise CheckpointError(f"payload member {name!r} is truncated")
            # an empty array's shape may still be beyond what NumPy can index
            array = np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran else "C")
    except CheckpointError:
        raise
    except _MALFORMED as exc:
        raise CheckpointError(f"payload member {name!r} is malformed: {exc}"[:300]) from exc
    array = array.copy()
    if array.dtype.kind == "f":  # finite in its saved dtype (`cast_finite`)
        cast_finite(array, array.dtype, f"the values of payload member {name!r}", CheckpointError)
    return array
