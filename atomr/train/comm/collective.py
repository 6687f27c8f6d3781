"""`Collective`: the interface of every reduction among trainers' participants,
and `HostCollective`, the in-process reference.

A collective spans a *group* of `n` participants. Each call passes the
caller's local contributions (`buffers`) and returns when the operation is
complete for the whole group:

| collective | group | `buffers` |
|---|---|---|
| `HostCollective` | the buffers of one call | host (NumPy) arrays, one per participant |
| `RingCollective` (`comm/ring/`) | member actors | their `ActorRef`s, in ring order |
| `MpiCollective` (`comm/mpi/`) | the processes of a job | this process's arrays |

The buffer conventions, the same for every collective ("participant k's
buffer": `buffers[k]` on the host, member k's own buffer in the ring, rank
k's `buffers[0]` across processes; "chunk k": positions `lo_k:hi_k` of
`split_bounds(len, n)`, the one partition rule of `core/partition.py`):

| operation | before | after |
|---|---|---|
| `all_reduce` | each buffer a contribution | every participant can read the sum (where: see the implementation) |
| `reduce_scatter` | each (flat) buffer a contribution | participant k's buffer holds, at chunk k, the sum of chunk k; the rest of it is unspecified |
| `all_gather` | participant k's (flat) buffer holds chunk k | every buffer holds every chunk k, copied from participant k |
| `broadcast` | the root's buffer | every buffer holds the root's bits |
| `barrier` | | every participant has arrived |

The dtypes, the same for every collective (`_checks.check_dtype`, the one
rule): the sums (`all_reduce`, `reduce_scatter`) take float32 and float64;
the copies (`all_gather`, `broadcast`) take every bool, integer, float or
complex dtype in native byte order (what MPI can move, bit for bit). Any
other dtype is a `TypeError` from every collective.

`reduce_scatter` then `all_gather` is an all-reduce into the participants'
own buffers. Every participant ends with the same bits. `len` need not be a
multiple of `n`: the first `len % n` chunks are one element longer.

An operation serves the purpose in effect (`comm/purpose.py`); across
processes, operations of different purposes never pair. `DataParallelTrainer`
uses one collective between its replicas, and one between processes.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from atomr.accel.serial_worker import SerialWorker
from atomr.train.comm._checks import SUMMED_DTYPES, check_buffers, check_root
from atomr.train.core._cpu import cpu_backend
from atomr.train.core.partition import split_bounds

__all__ = ["Collective", "HostCollective"]


class Collective(abc.ABC):
    """Sum, scatter, gather, broadcast and synchronise flat buffers across a group.

    The operations, their buffers and purposes: the module docstring. Every
    participant must get the same bits (replicas that apply a result stay
    identical), and no long loop may run on the event loop.

    Failures: an operation that a participant cannot complete (it failed, is
    gone, or did not take part in time) raises the implementation's error
    within a bounded time, never hangs: `RingCollective` the failing
    member's own error or `RingTimeoutError`, `MpiCollective` a
    `CollectiveError` (`RankFailedError`, `CollectiveTimeoutError`,
    `CollectiveMismatchError`).
    """

    members_hold_buffers: ClassVar[bool] = False
    """Where the buffers live; a trainer reads this, never the class.

    False (the default): `buffers` are host arrays the caller passes, and
    `all_reduce` returns the sum (`HostCollective`, `MpiCollective`).
    True: `buffers` are the members' `ActorRef`s; each member owns its
    buffer and the operation leaves the result there (`RingCollective`).
    Such a collective's `all_reduce` also takes the keywords `result_from`
    (return a host copy of that member's result, else None) and `interrupt`
    (a future whose result, an exception, abandons the operation at once:
    the trainer resolves it when its supervisor resumes a member, which may
    have lost a told message)."""

    @abc.abstractmethod
    async def all_reduce(self, buffers: Sequence[Any]) -> Any:
        """Element-wise sum over the whole group.

        Args:
            buffers: the caller's local contributions, all of one shape and
                dtype (see the module table for what each collective takes).

        Returns:
            A buffer holding the sum, which every participant may read: a new
            or reused array, or one of `buffers` updated in place. Collectives
            whose participants keep the sum themselves (`RingCollective`)
            return None.

        Raises:
            ValueError, TypeError: no buffers, buffers of different shapes /
                dtypes, or a dtype a sum does not take (see the module
                docstring).
        """

    @abc.abstractmethod
    async def reduce_scatter(self, buffers: Sequence[Any]) -> Any:
        """Sum over the group, each participant keeping one chunk of the sum.

        In place: afterwards participant k's buffer holds, at chunk k
        (`split_bounds(len, n)[k]`), the group's sum of those positions;
        the rest of its buffer is unspecified.

        Args:
            buffers: the caller's local contributions, flat and all of one
                length and dtype.

        Returns:
            The reduced chunks of the participants whose buffers the caller
            holds: views into those buffers (a list on the host, this rank's
            chunk across processes), or None where the participants are
            actors (`RingCollective`; a host copy of one member's chunk when
            asked for).

        Raises:
            ValueError, TypeError: no buffers, buffers of different shapes /
                dtypes, not flat, or a dtype a sum does not take (see the
                module docstring).
        """

    @abc.abstractmethod
    async def all_gather(self, buffers: Sequence[Any]) -> Any:
        """Give every participant every other participant's chunk.

        In place: participant k contributes chunk k of its buffer
        (`split_bounds(len, n)[k]`); afterwards every participant's buffer
        holds chunk j of participant j, for every j. The other positions of
        a participant's buffer are not read.

        Args:
            buffers: the caller's local participants' buffers, flat and all
                of one length and dtype.

        Returns:
            None (`RingCollective`: a host copy of one member's buffer,
            when asked for).

        Raises:
            ValueError, TypeError: no buffers, buffers of different shapes /
                dtypes, not flat, not writable, or a dtype a copy does not
                take (see the module docstring).
        """

    @abc.abstractmethod
    async def broadcast(self, buffers: Sequence[Any], root: int = 0) -> None:
        """Copy the root participant's buffer into every other participant's.

        Args:
            buffers: the caller's local participants' buffers.
            root: index of the participant whose buffer is copied (for a
                multi-process collective: the root rank).

        Raises:
            IndexError: `root` is out of range.
            TypeError: `root` is not an integer (NumPy integers are, bools
                are not).
            ValueError, TypeError: buffers of different shapes / dtypes, or
                a dtype a copy does not take (see the module docstring).
        """

    @abc.abstractmethod
    async def barrier(self, buffers: Sequence[Any] = ()) -> None:
        """Return once every participant of the group has reached the barrier.

        Args:
            buffers: the participants, for a collective that cannot know them
                otherwise (`RingCollective`: the members' `ActorRef`s);
                ignored by the others.
        """

    def close(self) -> None:
        """Release what the collective holds (threads, buffers); idempotent,
        and a later operation starts afresh. The default holds nothing.

        Whoever made the collective closes it: a trainer closes the one it
        made from a name in its options, never one it was given."""
        return None


class HostCollective(Collective):
    """The in-process reference: the five operations on host arrays, one
    participant per array.

    `all_reduce` writes `sum(buffers)` into one output buffer owned by the
    collective (allocated once per shape and dtype, then reused) with the CPU
    backend's fused `sum_into`: one read of each input, one write, no
    per-participant temporaries. The work runs on the collective's own worker
    thread (the kernel releases the GIL), never on the event loop.

    The returned buffer is reused by the next `all_reduce` of the same shape
    and dtype: read it (or copy it) before calling again. With `scale`,
    `all_reduce` also scales the sum and measures its squared norm in the
    same pass (`all_reduce_scaled`: the data-parallel trainer's
    single-process path). `reduce_scatter`, `all_gather` and `broadcast`
    work in place on the caller's arrays, on the same thread.

    Args:
        backend: the kernels to use (default: the CPU backend); it must sum
            every dtype a collective sums (`SUMMED_DTYPES`).

    Raises:
        ValueError: a backend that does not sum float32 and float64.
    """

    def __init__(self, backend: Any = None) -> None:
        if backend is None:
            backend = cpu_backend()
        missing = [str(d) for d in SUMMED_DTYPES if d not in backend.float_dtypes]
        if missing:
            raise ValueError(
                f"a HostCollective sums float32 and float64; backend {backend!r} "
                f"does not sum {' or '.join(missing)}"
            )
        self.backend = backend
        self._out: dict[tuple[tuple[int, ...], np.dtype], np.ndarray] = {}
        self._thread = SerialWorker("atomr-host-collective")
        self.last_squared_norm = 0.0
        """The squared norm measured by the last `all_reduce(..., scale=s)`."""

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await self._thread.run(fn, *args)

    def _out_for(self, like: np.ndarray) -> np.ndarray:
        key = (like.shape, like.dtype)
        out = self._out.get(key)
        if out is None:
            out = self._out[key] = np.empty(like.shape, dtype=like.dtype)
        return out

    def _sum(self, buffers: list[np.ndarray]) -> np.ndarray:
        """The sum of buffers `check_buffers` passed (in one of
        `SUMMED_DTYPES`, at every group size), into the collective's own
        output: the backend's unchecked kernel over flat views (copies where
        a buffer is not contiguous)."""
        out = self._out_for(buffers[0])
        if len(buffers) == 1:
            np.copyto(out, buffers[0])
            return out
        flats = []
        for b in buffers:
            flats.append(b.ravel())  # a copy where b is not contiguous (a 1-D slice too)
        self.backend.sum_into_unchecked(out.reshape(-1), flats)
        return out

    async def all_reduce(self, buffers: Sequence[Any], *, scale: float | None = None) -> np.ndarray:
        """The element-wise sum of `buffers` (see `Collective.all_reduce`).

        Args:
            buffers: host arrays of one shape and dtype (float32 or float64).
            scale: if set, the sum is also multiplied by it and its squared L2
                norm is measured in the same pass (the backend's fused
                `sum_scale_norm`: same bits as summing, then scaling), and
                left in `last_squared_norm`.

        Returns:
            The collective's output buffer holding the (scaled) sum (reused
            by the next call of the same shape and dtype).

        Raises:
            TypeError: not a list of numpy arrays, a dtype other than float32 /
                float64 (`_checks.check_dtype`), or a non-real `scale` (a bool).
            ValueError: no buffers, their shapes / dtypes differ, a `scale`
                not finite in their dtype, or with a `scale`, a buffer that is
                not C-contiguous (without one, such a buffer is copied).
        """
        checked = check_buffers(buffers, sums=True)
        if scale is None:
            result: np.ndarray = await self._run(self._sum, checked)
            return result

        def fused() -> np.ndarray:  # the kernel checks `scale` (its alpha)
            out = self._out_for(checked[0])
            self.last_squared_norm = self.backend.sum_scale_norm(out, checked, scale)
            return out

        result = await self._run(fused)
        return result

    async def all_reduce_scaled(
        self, buffers: Sequence[Any], scale: float
    ) -> tuple[np.ndarray, float]:
        """`all_reduce(buffers, scale=scale)` and the squared norm it measured.

        The data-parallel trainer's single-process path: the sum, its
        `1 / normaliser` scaling and the gradient norm in one pass, each
        input read once and the output written once.

        Returns:
            The output buffer (reused by the next call) and `sum(out^2)`
            (float64; inf or NaN when not finite).

        Raises:
            TypeError, ValueError: as `all_reduce`.
        """
        out = await self.all_reduce(buffers, scale=scale)
        return out, self.last_squared_norm

    async def reduce_scatter(self, buffers: Sequence[Any]) -> list[np.ndarray]:
        """Write chunk k of the sum into `buffers[k]` (see `Collective.reduce_scatter`).

        The sum is computed as by `all_reduce` (the same bits), then chunk k
        of it (`split_bounds(len, n)[k]`) is copied into `buffers[k]`; the
        other positions of each buffer are left as they were.

        Args:
            buffers: flat host arrays of one length and dtype, one per
                participant, writable.

        Returns:
            `[buffers[k][lo_k:hi_k] for k]`: each participant's reduced chunk,
            a view into its buffer.

        Raises:
            TypeError: not a list of numpy arrays, or a dtype other than
                float32 / float64 (`_checks.check_dtype`).
            ValueError: no buffers, their shapes / dtypes differ, they are
                not 1-D, or one is read-only.
        """
        checked = check_buffers(buffers, sums=True, flat=True, writable=True)
        bounds = split_bounds(checked[0].size, len(checked))

        def scatter() -> list[np.ndarray]:
            total = self._sum(checked)
            chunks = [b[lo:hi] for b, (lo, hi) in zip(checked, bounds, strict=True)]
            for chunk, (lo, hi) in zip(chunks, bounds, strict=True):
                np.copyto(chunk, total[lo:hi])
            return chunks

        result: list[np.ndarray] = await self._run(scatter)
        return result

    async def all_gather(self, buffers: Sequence[Any]) -> None:
        """Copy chunk k of `buffers[k]` into every other buffer (see
        `Collective.all_gather`).

        Args:
            buffers: flat host arrays of one length and dtype, one per
                participant, writable.

        Raises:
            TypeError, ValueError: as `reduce_scatter`, but the dtypes taken
                are those copied (bool, integer, float or complex, in native
                byte order: `_checks.check_dtype`).
        """
        checked = check_buffers(buffers, sums=False, flat=True, writable=True)
        bounds = split_bounds(checked[0].size, len(checked))

        def gather() -> None:
            for k, (lo, hi) in enumerate(bounds):
                for j, b in enumerate(checked):
                    if j != k:
                        np.copyto(b[lo:hi], checked[k][lo:hi])

        await self._run(gather)

    async def broadcast(self, buffers: Sequence[Any], root: int = 0) -> None:
        """Copy `buffers[root]` into every other buffer (see `Collective.broadcast`).

        Raises:
            IndexError: `root` is out of range.
            TypeError: `root` is not an integer; or as `all_reduce`, but
                the dtypes taken are those copied (as `all_gather`).
            ValueError: as `all_reduce`; also a read-only buffer other than
                the root's.
        """
        checked = check_buffers(buffers, sums=False)
        root = check_root(root, len(checked))
        for k, b in enumerate(checked):  # all refused before any is written
            if k != root and not b.flags.writeable:
                raise ValueError(f"buffers[{k}] must be writable (the root's buffer is copied in)")

        def copy_all() -> None:
            for k, b in enumerate(checked):
                if k != root:
                    np.copyto(b, checked[root])

        await self._run(copy_all)

    async def barrier(self, buffers: Sequence[Any] = ()) -> None:
        """A no-op: one process, and every call already waits for its work.

        Args:
            buffers: ignored.
        """

    def close(self) -> None:
        """Stop the worker thread and drop the output buffers (a later call
        starts a new thread)."""
        self._thread.close()
        self._out.clear()
