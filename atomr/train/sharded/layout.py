"""`ShardLayout`: which positions of the flat parameter vector each replica owns.

The vector is cut into *units*: the whole vector for stages 1 and 2, one
unit per top-level layer (`Sequential.layer_ranges`; empty for a layer
without parameters) for stage 3, whose layers are gathered one at a time. Each unit is split the way the collectives split a buffer
(`core/partition.py`), on two levels: first across the processes of a job
(process `p` gets chunk `p` of `split_bounds(unit_len, P)`: what an MPI
reduce-scatter leaves it), then that chunk across the process's `M` local
replicas (replica `k` gets chunk `k` of the chunk). With one process this is
exactly chunk `k` of `split_bounds(unit_len, M)`, the chunk the local
collective's `reduce_scatter` leaves participant `k`. Neither `P` nor `M`
need divide anything; a replica may own nothing of a short unit.

A replica keeps what it owns as one *piece*: its positions of every unit,
concatenated in unit order. Its optimizer state covers exactly its piece;
optimizer updates are element-wise, so updating pieces equals updating the
whole vector.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from atomr.train.core.model.sequential import Sequential
from atomr.train.core.partition import split_bound

__all__ = ["ShardLayout"]


@dataclass(frozen=True)
class ShardLayout:
    """The owned positions of every local replica of one process.

    Attributes:
        units: `(start, stop)` of each unit in the flat vector.
        replicas: the local replicas `M` (>= 1).
        processes: the processes of the job `P` (>= 1).
        process_rank: this process's rank in `[0, P)`.
    """

    units: tuple[tuple[int, int], ...]
    replicas: int
    processes: int = 1
    process_rank: int = 0

    @classmethod
    def for_model(
        cls, model: Sequential, stage: int, replicas: int, processes: int = 1, process_rank: int = 0
    ) -> ShardLayout:
        """The layout of `model` for a ZeRO `stage` (one unit per top-level layer for 3).

        Raises:
            ValueError: a replica of some process would own no parameter (a
                model with fewer parameters than the job has replicas).
        """
        if stage < 3:
            units: tuple[tuple[int, int], ...] = ((0, model.n_params),)
        else:
            units = tuple(model.layer_ranges())  # a layer without parameters: an empty unit
        # pieces shrink with the rank and the replica (longer chunks first): when
        # the last replica of the last process owns something, every one does
        if cls(units, replicas, processes, processes - 1).piece_len(replicas - 1) > 0:
            return cls(units, replicas, processes, process_rank)
        for rank in range(processes):  # name the first that owns nothing, as every process does
            layout = cls(units, replicas, processes, rank)
            for k in range(replicas):
                if layout.piece_len(k) == 0:
                    cut = "each layer's parameters" if stage == 3 else "the parameters"
                    raise ValueError(
                        f"ZeRO stage {stage}: replica {k} of process {rank} would own none of "
                        f"the model's {model.n_params} parameters ({cut} split "
                        f"{replicas * processes} ways); use fewer devices"
                    )
        raise AssertionError("unreachable: the last piece is empty")

    @property
    def n_params(self) -> int:
        """The length of the flat vector."""
        return self.units[-1][1]

    def process_chunk(self, unit_len: int) -> tuple[int, int]:
        """This process's `(lo, hi)` within a unit of `unit_len`."""
        return split_bound(unit_len, self.processes, self.process_rank)

    def unit_bounds(self, unit_len: int, replica: int) -> tuple[int, int]:
        """Replica `replica`'s `(lo, hi)` within a unit of `unit_len`."""
        lo, hi = self.process_chunk(unit_len)
        sub_lo, sub_hi = split_bound(hi - lo, self.replicas, replica)
        return lo + sub_lo, lo + sub_hi

    def owned(self, replica: int) -> list[tuple[int, int]]:
        """Replica `replica`'s `(lo, hi)` in the flat vector, one per unit."""
        found = []
        for start, stop in self.units:
            lo, hi = self.unit_bounds(stop - start, replica)
            found.append((start + lo, start + hi))
        return found

    def piece_offsets(self, replica: int) -> list[int]:
        """Where each unit's part starts in replica `replica`'s piece (and,
        last, the piece's length)."""
        offsets = [0]
        for lo, hi in self.owned(replica):
            offsets.append(offsets[-1] + hi - lo)
        return offsets

    def piece_len(self, replica: int) -> int:
        """Elements replica `replica` owns."""
        return self.piece_offsets(replica)[-1]

    def take(self, vector: np.ndarray, replica: int) -> np.ndarray:
        """Replica `replica`'s piece of a full host vector (a new array)."""
        parts = [vector[lo:hi] for lo, hi in self.owned(replica)]
        return np.concatenate(parts) if parts else vector[:0].copy()

    def put(self, vector: np.ndarray, replica: int, piece: np.ndarray) -> None:
        """Write replica `replica`'s piece into its positions of `vector`.

        Raises:
            ValueError: `piece` has another length than the replica owns.
        """
        offsets = self.piece_offsets(replica)
        if piece.shape[0] != offsets[-1]:
            raise ValueError(
                f"piece has {piece.shape[0]} values, replica {replica} owns {offsets[-1]}"
            )
        for (lo, hi), at in zip(self.owned(replica), offsets, strict=False):
            vector[lo:hi] = piece[at : at + hi - lo]

    def assemble(self, pieces: Sequence[np.ndarray], dtype: np.dtype) -> np.ndarray:
        """The full vector from every local replica's piece (positions other
        processes own are 0)."""
        full = np.zeros(self.n_params, dtype=dtype)
        for k, piece in enumerate(pieces):
            self.put(full, k, np.asarray(piece))
        return full
