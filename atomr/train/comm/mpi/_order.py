"""The operation check: before each operation's MPI call, the ranks of an
`MpiCollective` exchange what they are about to do, and none runs it unless
all are about to do the same.

MPI requires every rank to issue the same collectives in the same order,
with matching sizes; a mismatch is undefined behaviour (wrong data,
truncation, a hang), and MPI itself rarely notices. For example, a lone
rank's checkpoint save (all-gathers) that meets another rank's training
step (reduce-scatters of the same length) can "succeed" with garbage.

The *signature* of an operation is its number (the driver's `seq`, equal
on every rank while they are in step), its kind, its element count, its
dtype (kind character and item size), its root (broadcast; -1 otherwise),
its mean (the number of local buffers a rank averages, which every rank
divides by: 0 for a sum or a copy) and its purpose (`comm/purpose.py`: a
hash of the text, and its first 24 bytes for errors): seven int64 and 24
bytes. One `Iallgather` of the
signatures (80 bytes a rank, on the collective's own communicator, just
before the operation's call) gives every rank every rank's; if they
differ, every rank raises the same `CollectiveMismatchError` naming each
rank's operation, and no rank issues the operation. The exchange is waited
for like the operation itself (spun on the loop, then parked, within the
same timeout), so a rank that never arrives is still named by
`CollectiveTimeoutError`.

Cost: one small-message latency and a few microseconds of Python per
operation (`docs/benchmarks.md`, "Session 18: the operation check").
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from atomr.train.comm.mpi.errors import CollectiveMismatchError
from atomr.train.comm.purpose import current_purpose

__all__ = [
    "KINDS",
    "OrderCheck",
    "Signature",
    "agree_on_check",
    "describe_signature",
    "signature_of",
]

KINDS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "barrier")
"""The operations, by their code in a signature."""

_CODES = {kind: code for code, kind in enumerate(KINDS)}
_LAYOUT = struct.Struct("=7q24s")  # seq, kind, count, dtype, root, mean, purpose (hash, name)

Signature = tuple[int, int, int, int, int, bytes]
"""An operation's count, dtype code, root, mean and purpose (hash, name):
what `signature_of` returns and `OrderCheck.start` sends after the seq and
kind."""


def agree_on_check(comm: Any, enabled: bool) -> None:
    """Check that every rank of `comm` has the check on, or every rank off
    (one rank's exchange would otherwise meet another's operation). A
    blocking collective, once, when the `MpiCollective` is made.

    Raises:
        ValueError: the ranks disagree; names the ranks that have it off.
    """
    size = comm.Get_size()
    if size == 1:
        return
    flags = np.zeros(size, dtype=np.int64)
    comm.Allgather(np.array([int(enabled)], dtype=np.int64), flags)
    if flags.min() != flags.max():
        off = [str(k) for k in np.flatnonzero(flags == 0)]
        who = f"{'rank' if len(off) == 1 else 'ranks'} {', '.join(off)}"
        raise ValueError(
            f"check_order must be the same on every rank; {who} turned it off "
            f"and the others did not (rank {comm.Get_rank()} has it "
            f"{'on' if enabled else 'off'})"
        )


def signature_of(buffer: np.ndarray | None, root: int = -1, mean: int = 0) -> Signature:
    """The shape of an operation on `buffer` (None: a barrier), issued here,
    in a signature: (element count, dtype code, root, mean, purpose hash,
    purpose name), the purpose being the one in effect (`comm/purpose.py`);
    `mean`: the local buffers of a reduction with `op="mean"` (the ranks
    must agree: each divides by `world_size * mean`), 0 for a sum."""
    why = current_purpose()
    if buffer is None:
        return (0, 0, root, mean, why.code, why.name)
    dtype = buffer.dtype
    return (buffer.size, ord(dtype.kind) << 8 | dtype.itemsize, root, mean, why.code, why.name)


def describe_signature(row: Sequence[Any]) -> str:
    """An operation's signature in words, e.g. "all_reduce #7 (1024 float32)",
    "all_reduce #7 (1024 float32, mean of 2 a rank)" for a mean of 2 local
    buffers, or "all_reduce #7 (2 float64, for 'save checkpoint')" when it
    has a purpose."""
    seq, code, count, dtype, root, mean = (int(v) for v in row[:6])
    why = _describe_purpose(row)
    if not 0 <= code < len(KINDS):
        return f"an unknown operation #{seq} (code {code})"
    kind = KINDS[code]
    if kind == "barrier":
        return f"barrier #{seq}" + (f" ({why})" if why else "")
    try:
        name = np.dtype(f"{chr(dtype >> 8)}{dtype & 0xFF}").name
    except (TypeError, ValueError):
        name = f"dtype code {dtype}"
    where = f", root {root}" if kind == "broadcast" else ""
    where += f", mean of {mean} a rank" if mean else ""
    return f"{kind} #{seq} ({count} {name}{where}{', ' + why if why else ''})"


def _describe_purpose(row: Sequence[Any]) -> str:
    """ "for 'step'", or "" for an operation without a purpose."""
    if len(row) < 8 or not row[6]:
        return ""
    name = bytes(row[7]).rstrip(b"\0").decode(errors="replace")
    return f"for {name!r}"


class OrderCheck:
    """The signature exchange of one rank, on the collective's communicator.

    Args:
        mpi: the `mpi4py.MPI` module.
        comm: the collective's communicator (more than one rank).
    """

    def __init__(self, mpi: Any, comm: Any) -> None:
        self.rank: int = comm.Get_rank()
        self.world_size: int = comm.Get_size()
        self._comm = comm
        self._send = bytearray(_LAYOUT.size)
        self._recv = bytearray(_LAYOUT.size * self.world_size)
        self._send_spec = [self._send, mpi.INT64_T]
        self._recv_spec = [self._recv, mpi.INT64_T]

    def start(self, seq: int, kind: str, signature: Signature) -> Any:
        """Start the exchange for operation `seq`; returns its MPI request.

        Raises:
            KeyError: `kind` is not one of `KINDS`.
            mpi4py.MPI.Exception: MPI refused the call.
        """
        _LAYOUT.pack_into(self._send, 0, seq, _CODES[kind], *signature)
        return self._comm.Iallgather(self._send_spec, self._recv_spec)

    def mismatch(self) -> CollectiveMismatchError | None:
        """After the exchange completed: None when every rank sent this
        rank's signature, else the error naming each rank's operation."""
        # world_size non-overlapping copies of the signature fill the buffer
        # only if every rank's slot holds it; count allocates nothing
        if self._recv.count(self._send) == self.world_size:
            return None
        rows = [
            describe_signature(_LAYOUT.unpack_from(self._recv, k * _LAYOUT.size))
            for k in range(self.world_size)
        ]
        size = _LAYOUT.size
        seq, code = _LAYOUT.unpack_from(self._send)[:2]
        others = [
            k for k in range(self.world_size) if self._recv[k * size : (k + 1) * size] != self._send
        ]
        listed = ", ".join(
            f"rank {k} is at {row}" if k == 0 else f"rank {k} at {row}"
            for k, row in enumerate(rows)
        )
        return CollectiveMismatchError(
            f"MPI operations out of step on rank {self.rank} of {self.world_size}: {listed}; "
            "no rank ran it (every rank must issue the same operations in the same "
            "order, with the same sizes, dtypes, roots, means and purposes)",
            operations=rows,
            ranks=others,
            operation=f"{KINDS[code]} #{seq}",
        )
