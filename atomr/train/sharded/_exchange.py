"""`ShardExchange`: the reduce-scatter and all-gather of one unit across every
replica of a job, on the `Collective` interface.

Each local replica hands over a host buffer of the unit's length (on a CPU
device its own memory, else a host copy). Both operations work in place on
those buffers, at the positions `ShardLayout.unit_bounds` gives each replica:

- `reduce_scatter`: afterwards replica k's buffer holds, at its positions,
  the sum over every replica of the job. One process: the local
  collective's `reduce_scatter` (its chunk k is replica k's positions).
  Several: the process collective's `reduce_scatter` over the local buffers
  (MPI sums them, then `Ireduce_scatter` leaves this process its chunk in
  `buffers[0]`), then each local replica's part of that chunk is copied to
  its own buffer.
- `all_gather`: replica k's buffer holds its part at its positions;
  afterwards every buffer holds the whole unit. One process: the local
  collective's `all_gather`. Several: the local parts are copied into
  `buffers[0]`, then the process collective's `all_gather` (MPI fills
  `buffers[0]` from the other ranks and copies it to the other local buffers).
"""

from __future__ import annotations

import numpy as np

from atomr.accel.serial_worker import SerialWorker
from atomr.train.comm.collective import Collective
from atomr.train.sharded.layout import ShardLayout

__all__ = ["ShardExchange"]


class ShardExchange:
    """The two operations of the module docstring over one layout.

    Args:
        collective: joins the local replicas (host buffers).
        processes: joins the processes of a job, or None for one process.
        layout: who owns what.
        host: the thread for host-side copies.
    """

    def __init__(
        self,
        collective: Collective,
        processes: Collective | None,
        layout: ShardLayout,
        host: SerialWorker,
    ) -> None:
        self.collective = collective
        self.processes = processes
        self.layout = layout
        self.host = host

    async def reduce_scatter(self, buffers: list[np.ndarray]) -> None:
        """Sum the unit over the job; each replica keeps its positions (module docstring).

        Raises:
            Exception: the collectives' own errors.
        """
        if self.processes is None:
            await self.collective.reduce_scatter(buffers)
            return
        await self.processes.reduce_scatter(buffers)
        await self.host.run(self._spread_chunk, buffers)

    def _spread_chunk(self, buffers: list[np.ndarray]) -> None:
        n = buffers[0].size
        for k in range(1, len(buffers)):
            lo, hi = self.layout.unit_bounds(n, k)
            np.copyto(buffers[k][lo:hi], buffers[0][lo:hi])

    async def all_gather(self, buffers: list[np.ndarray]) -> None:
        """Give every replica the whole unit (module docstring).

        Raises:
            Exception: the collectives' own errors.
        """
        if self.processes is None:
            await self.collective.all_gather(buffers)
            return
        await self.host.run(self._collect_chunk, buffers)
        await self.processes.all_gather(buffers)

    def _collect_chunk(self, buffers: list[np.ndarray]) -> None:
        n = buffers[0].size
        for k in range(1, len(buffers)):
            lo, hi = self.layout.unit_bounds(n, k)
            np.copyto(buffers[0][lo:hi], buffers[k][lo:hi])

    async def sum_scalars(self, values: list[float]) -> list[float]:
        """Sum a few float64 totals over the processes (itself for one process)."""
        if self.processes is None:
            return values
        summed = await self.processes.all_reduce([np.array(values, dtype=np.float64)])
        return [float(v) for v in summed]

    async def assemble(self, full: np.ndarray) -> np.ndarray:
        """Complete a vector whose other processes' positions are 0 (checkpoints):
        an all-reduce, since every position is owned by exactly one process."""
        if self.processes is None:
            return full
        summed = await self.processes.all_reduce([full])
        return np.array(summed, copy=True)
