"""`purpose`: what the collective operations issued in a block are for.

Every collective runs its operations for a purpose the caller names with
`with purpose("save checkpoint"): ...`, the one rule for all of them. The
purpose is held in a context variable, so it follows the code that issues
the operations (the task, and the tasks it starts) and nothing else; the
innermost block wins; outside any block an operation has no purpose.

An in-process collective (`HostCollective`, `RingCollective`) has nothing
to compare it with and ignores it. `MpiCollective` puts it in each
operation's signature (`mpi/_order.py`): ranks whose operations match in
kind, size and dtype but serve different purposes (a lone rank's
checkpoint agreement meeting the others' step scalars) raise
`CollectiveMismatchError` on every rank, naming each rank's purpose,
instead of summing one's metadata into the other's statistics.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
from collections.abc import Iterator
from contextvars import ContextVar

__all__ = ["NO_PURPOSE", "Purpose", "current_purpose", "purpose"]

_NAME_BYTES = 24  # the start of a purpose's text that a signature carries, for errors


class Purpose:
    """A purpose as a signature carries it: a 64-bit hash of its whole text
    (stable across processes, unlike `hash()`), which ranks compare, and the
    first 24 bytes of its UTF-8 text, which errors show (a longer text:
    its first 21 bytes and "..."). A lone surrogate is encoded as
    `surrogatepass` writes it.

    Args:
        text: the purpose ("" for none).
    """

    __slots__ = ("code", "name", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        raw = text.encode(errors="surrogatepass")  # any str: a lone surrogate too
        digest = hashlib.blake2b(raw, digest_size=8).digest() if text else bytes(8)
        self.code = int.from_bytes(digest, "little", signed=True)
        cut = len(raw) > _NAME_BYTES
        self.name = raw[: _NAME_BYTES - 3].decode(errors="ignore").encode() + b"..." if cut else raw


NO_PURPOSE = Purpose("")
"""The purpose of an operation issued outside every `purpose` block."""

_purpose_of = functools.lru_cache(maxsize=64)(Purpose)  # a trainer enters a few, often

_CURRENT: ContextVar[Purpose] = ContextVar("atomr_collective_purpose", default=NO_PURPOSE)


@contextlib.contextmanager
def purpose(text: str) -> Iterator[None]:
    """Issue the collective operations of the block for `text`.

    Args:
        text: what the operations are for ("step", "save checkpoint"),
            the same text on every process that issues them; any non-empty
            string (a signature carries a hash of all of it and the first
            24 bytes of its UTF-8 for errors: `Purpose`).

    Raises:
        TypeError: `text` is not a str.
        ValueError: `text` is empty.
    """
    if not isinstance(text, str):
        raise TypeError(f"a purpose must be a str, got {type(text).__name__}")
    if not text:
        raise ValueError("a purpose must not be empty (outside every block there is none)")
    token = _CURRENT.set(_purpose_of(text))
    try:
        yield
    finally:
        _CURRENT.reset(token)


def current_purpose() -> Purpose:
    """The purpose in effect here: the innermost `purpose` block's, else
    `NO_PURPOSE`."""
    return _CURRENT.get()
