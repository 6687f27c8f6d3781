"""The frame of a checkpoint file: magic, header length, header, payload and
checksum (the layout: `atomr.train.core.checkpoint`), read without trusting
a number in it.

The file's size is taken once (`fstat`) and every length the file declares
is checked against it before a byte it counts is read: the header's length,
then the payload's (`payload_len`, in the header). A file larger than its
header says (trailing bytes, or a sparse file of a terabyte behind a valid
header) is refused unread, and so is a payload larger than this machine's
memory, which could not be loaded anyway.

The header's JSON is decoded once, here, before the payload is read (its
`payload_len` is one of those lengths); its fields are checked by the
caller (`check_header`). A header that is not JSON is refused only once
the checksum is verified, so that a bit flip is reported as one.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from typing import BinaryIO

from atomr.train.core._checkpoint_validation import open_regular_file
from atomr.train.core.errors import CheckpointError

__all__ = ["MAGIC", "checkpoint_digest", "read_frame"]

MAGIC = b"ATOMRCK1"
LENGTH = struct.Struct("<Q")
DIGEST = 32
PREFIX = len(MAGIC) + LENGTH.size
MAX_HEADER = 64 * 2**20
"""The longest header read (a model's config, the optimizer's settings and
the trainer's scalars: kilobytes)."""


def payload_bound() -> int:
    """The largest payload read: this machine's physical memory (a payload
    is held whole while its arrays are copied out), or 2**40 where the
    platform does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return 2**40


def checkpoint_digest(path: str | os.PathLike[str]) -> str:
    """Which save a checkpoint file is: the SHA-256 it ends with, in hex, read alone.

    Raises:
        OSError: the file cannot be read.
        CheckpointError: not a regular file (a FIFO is not waited on), or too short.
    """
    with open_regular_file(os.fspath(path)) as file:
        size = file.seek(0, os.SEEK_END)
        if size < PREFIX + DIGEST:
            raise CheckpointError(f"{path}: not an atomr checkpoint (too short: {size} bytes)")
        file.seek(size - DIGEST)
        return file.read(DIGEST).hex()


def read_frame(where: str) -> tuple[object, bytes]:
    """The header (its JSON decoded, its fields unchecked: `check_header`)
    and the payload bytes of the checkpoint file `where`, its checksum
    verified; each length checked against the file's size before what it
    counts is read.

    Raises:
        FileNotFoundError: `where` does not exist (OSError: it cannot be read).
        CheckpointError: not a regular file, bad magic, truncated, a header
            longer than 64 MiB or than the file, a file larger than its
            header says (trailing bytes), a payload larger than this
            machine's memory, a checksum mismatch (so reported, too, for
            a wrong length in a file of at most 64 MiB: a bit flip), or a
            header that is not JSON.
    """
    with open_regular_file(where) as fh:
        size = os.fstat(fh.fileno()).st_size
        prefix = fh.read(PREFIX)
        if len(prefix) < PREFIX or size < PREFIX + DIGEST or not prefix.startswith(MAGIC):
            raise CheckpointError(f"{where}: not an atomr checkpoint (bad magic or truncated)")
        try:
            text = _read_header(fh, where, size, prefix)
            header = _decoded(text)
            payload_len = size - PREFIX - len(text) - DIGEST
            _check_payload_len(where, header, payload_len)
        except CheckpointError:
            _check_small_file(fh, where, size)  # a bit flip in a length says so
            raise
        payload = fh.read(payload_len)
        digest = fh.read(DIGEST + 1)
    if len(payload) != payload_len or len(digest) != DIGEST:
        raise CheckpointError(f"{where}: checksum mismatch (file corrupted or truncated)")
    sha = hashlib.sha256(prefix)
    sha.update(text)
    sha.update(payload)
    if sha.digest() != digest:
        raise CheckpointError(f"{where}: checksum mismatch (file corrupted or truncated)")
    if isinstance(header, Exception):
        raise CheckpointError(f"{where}: header is not JSON: {header}") from header
    return header, payload


def _decoded(text: bytes) -> object:
    """The header's JSON value, or the exception that decoding it raised
    (refused once the checksum is verified: a bit flip is a checksum
    mismatch); no JSON value is an exception."""
    try:
        return json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return exc


def _read_header(fh: BinaryIO, where: str, size: int, prefix: bytes) -> bytes:
    """The header's bytes, its length (in `prefix`) checked first against
    the file's `size` and `MAX_HEADER`.

    Raises:
        CheckpointError: it is longer than either, or the file shrank.
    """
    (header_len,) = LENGTH.unpack_from(prefix, len(MAGIC))
    if header_len > size - PREFIX - DIGEST:
        raise CheckpointError(f"{where}: header_len {header_len} exceeds the file")
    if header_len > MAX_HEADER:
        raise CheckpointError(
            f"{where}: header_len {header_len} is more than a header's {MAX_HEADER} bytes"
        )
    header = fh.read(header_len)
    if len(header) != header_len:
        raise CheckpointError(f"{where}: checksum mismatch (file corrupted or truncated)")
    return header


def _check_small_file(fh: BinaryIO, where: str, size: int) -> None:
    """Where a length is wrong, a file of at most `MAX_HEADER` bytes (cheap
    to read) is checked whole, so that corruption is reported as a checksum
    mismatch, as it was when every file was read whole.

    Raises:
        CheckpointError: its checksum does not match.
    """
    if size <= MAX_HEADER:
        fh.seek(0)
        raw = fh.read(size)
        if hashlib.sha256(raw[:-DIGEST]).digest() != raw[-DIGEST:]:
            raise CheckpointError(f"{where}: checksum mismatch (file corrupted or truncated)")


def _check_payload_len(where: str, header: object, payload_len: int) -> None:
    """Refuse, before it is read, a payload of `payload_len` bytes (what the
    file holds after its header) that is more than the decoded `header`'s
    `payload_len` (one not an int is left to `check_header`), or beyond
    `payload_bound`.

    Raises:
        CheckpointError: as said.
    """
    declared = header.get("payload_len") if isinstance(header, dict) else None
    if isinstance(declared, int) and not isinstance(declared, bool) and declared < payload_len:
        raise CheckpointError(
            f"{where}: the file is larger than its header says (payload_len {declared}, "
            f"{payload_len} bytes after the header): trailing bytes"
        )
    if payload_len > payload_bound():
        raise CheckpointError(
            f"{where}: a payload of {payload_len} bytes, more than this machine's memory"
        )
