"""`Collective`: the interface of every reduction among trainers' participants,
and `HostCollective`, the in-process reference.

A collective spans a *group* of participants. Each call passes the caller's
local contributions (`buffers`, one per local participant) and returns when
the operation is complete for the whole group:

| collective | group | `buffers` |
|---|---|---|
| `HostCollective` | the buffers of one call | host (NumPy) arrays |
| `RingAllReduce` (`ring_all_reduce.py`) | replica actors | their `ActorRef`s |
| `MpiCollective` (MPI backend) | the processes of a job | this process's arrays |

`DataParallelTrainer` uses one collective between its local replicas and,
optionally, a second one (`process_collective`) between processes.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

import numpy as np

__all__ = ["Collective", "HostCollective"]


class Collective(abc.ABC):
    """Sum, broadcast and synchronise flat buffers across a group.

    Implementations must give every participant the same bits (so replicas
    that apply the result stay identical) and must not run long loops on the
    event loop.
    """

    members_hold_buffers: ClassVar[bool] = False
    """Where the buffers live; a trainer reads this, never the class.

    False (the default): `buffers` are host arrays the caller passes, and
    `all_reduce` returns the sum (`HostCollective`, `MpiCollective`).
    True: `buffers` are the members' `ActorRef`s; each member owns its
    buffer and the operation leaves the result there (`RingAllReduce`).
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
            whose participants keep the sum themselves (`RingAllReduce`)
            return None.

        Raises:
            ValueError, TypeError: no buffers, or buffers of different
                shapes / dtypes.
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
            ValueError, TypeError: buffers of different shapes / dtypes.
        """

    @abc.abstractmethod
    async def barrier(self) -> None:
        """Return once every participant of the group has reached the barrier."""


def _check_buffers(buffers: Sequence[Any]) -> list[np.ndarray]:
    if isinstance(buffers, np.ndarray) or not isinstance(buffers, Sequence):
        raise TypeError(f"buffers must be a list of arrays, got {type(buffers).__name__}")
    if len(buffers) == 0:
        raise ValueError("a collective needs at least one buffer")
    out = []
    for k, b in enumerate(buffers):
        if not isinstance(b, np.ndarray):
            raise TypeError(f"buffers[{k}] must be a numpy array, got {type(b).__name__}")
        if b.shape != buffers[0].shape or b.dtype != buffers[0].dtype:
            raise ValueError(
                f"buffers[{k}] is {b.dtype}{b.shape}, buffers[0] is "
                f"{buffers[0].dtype}{buffers[0].shape}; all must match"
            )
        out.append(b)
    return out


class HostCollective(Collective):
    """The in-process reference: the sum of host arrays, computed in one pass.

    `all_reduce` writes `sum(buffers)` into one output buffer owned by the
    collective (allocated once per shape and dtype, then reused) with the CPU
    backend's fused `sum_into`: one read of each input, one write, no
    per-participant temporaries. The work runs on the collective's own worker
    thread (the kernel releases the GIL), never on the event loop.

    The returned buffer is reused by the next `all_reduce` of the same shape
    and dtype: read it (or copy it) before calling again. With `scale`,
    `all_reduce` also scales the sum and measures its squared norm in the
    same pass (`all_reduce_scaled`: the data-parallel trainer's
    single-process path).

    Args:
        backend: the kernels to use (default: the CPU backend).
    """

    def __init__(self, backend: Any = None) -> None:
        if backend is None:
            from atomr.train.core._cpu import cpu_backend

            backend = cpu_backend()
        self.backend = backend
        self._out: dict[tuple[tuple[int, ...], np.dtype], np.ndarray] = {}
        self._executor: ThreadPoolExecutor | None = None
        self.last_squared_norm = 0.0
        """The squared norm measured by the last `all_reduce(..., scale=s)`."""

    async def _run(self, fn: Any, *args: Any) -> Any:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="atomr-host-collective")
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _out_for(self, like: np.ndarray) -> np.ndarray:
        key = (like.shape, like.dtype)
        out = self._out.get(key)
        if out is None:
            out = self._out[key] = np.empty(like.shape, dtype=like.dtype)
        return out

    def _sum(self, buffers: list[np.ndarray]) -> np.ndarray:
        out = self._out_for(buffers[0])
        if len(buffers) == 1:
            np.copyto(out, buffers[0])
        else:
            self.backend.sum_into(out, buffers)
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
            TypeError: not a list of numpy arrays, or a dtype the backend
                does not accept.
            ValueError: no buffers, or their shapes / dtypes differ.
        """
        checked = _check_buffers(buffers)
        if scale is None:
            result: np.ndarray = await self._run(self._sum, checked)
            return result
        factor = float(scale)

        def fused() -> np.ndarray:
            out = self._out_for(checked[0])
            self.last_squared_norm = self.backend.sum_scale_norm(out, checked, factor)
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

    async def broadcast(self, buffers: Sequence[Any], root: int = 0) -> None:
        """Copy `buffers[root]` into every other buffer (see `Collective.broadcast`).

        Raises:
            IndexError: `root` is out of range.
            TypeError, ValueError: as `all_reduce`.
        """
        checked = _check_buffers(buffers)
        if not 0 <= root < len(checked):
            raise IndexError(f"root {root} out of range for {len(checked)} buffers")

        def copy_all() -> None:
            for k, b in enumerate(checked):
                if k != root:
                    np.copyto(b, checked[root])

        await self._run(copy_all)

    async def barrier(self) -> None:
        """A no-op: one process, and every call already waits for its work."""

    def close(self) -> None:
        """Stop the worker thread and drop the output buffers (a later call
        starts a new thread)."""
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False)
        self._out.clear()
