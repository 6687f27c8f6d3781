"""The number of processes of a job is an MPI world size, which MPI numbers
with C ints: `MAX_PROCESSES` (2**31 - 1) bounds it wherever it is given, so
that `process_count=10**12` is refused naming it, where it was taken and the
first multi-process `Step` cut its batch into 10**12 shares (a MemoryError).
A ZeRO layout of many processes is checked in one piece, not every
process's every replica (P * M pieces of P chunks each)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from atomr.train.comm import HostCollective
from atomr.train.comm.mpi.job import MAX_PROCESSES, DistributedTrainConfig
from atomr.train.core import Mlp
from atomr.train.data_parallel.options import DataParallelOptions
from atomr.train.sharded.layout import ShardLayout
from atomr.train.sharded.options import ShardedOptions

SITES: dict[str, tuple[Callable[[int], object], str]] = {
    "DistributedTrainConfig": (lambda n: DistributedTrainConfig(world_size=n), "world_size"),
    "DataParallelOptions": (
        lambda n: DataParallelOptions(process_count=n, process_collective=HostCollective()),
        "process_count",
    ),
    "ShardedOptions": (
        lambda n: ShardedOptions(process_count=n, process_collective=HostCollective()),
        "process_count",
    ),
}


@pytest.mark.parametrize("site", list(SITES))
def test_a_process_count_beyond_mpis_ranks_is_refused_naming_it(site: str) -> None:
    build, name = SITES[site]
    assert build(MAX_PROCESSES) is not None
    for count in (MAX_PROCESSES + 1, 10**12):
        with pytest.raises(ValueError, match=f"{name} must be <= {MAX_PROCESSES}, got {count}"):
            build(count)


def test_the_limit_is_mpis_int() -> None:
    assert MAX_PROCESSES == 2**31 - 1


def test_a_layout_of_many_processes_checks_only_the_smallest_piece(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It checked every replica of every process (here 8 * 4096 pieces, each
    cutting the unit into 4096 chunks: seconds; quadratic in the processes)."""
    checked: list[int] = []
    piece_len = ShardLayout.piece_len

    def counted(layout: ShardLayout, replica: int) -> int:
        checked.append(replica)
        return piece_len(layout, replica)

    monkeypatch.setattr(ShardLayout, "piece_len", counted)
    model = Mlp([256, 256, 10])
    layout = ShardLayout.for_model(model, 1, 8, processes=4096, process_rank=5)
    assert (layout.processes, layout.process_rank, checked) == (4096, 5, [7])


@given(
    st.lists(st.integers(0, 40), min_size=1, max_size=4),
    st.integers(1, 6),
    st.integers(1, 6),
)
def test_the_last_replica_of_the_last_process_owns_the_least(
    lengths: list[int], replicas: int, processes: int
) -> None:
    """What the check relies on: pieces shrink with the rank and the replica."""
    starts = [sum(lengths[:i]) for i in range(len(lengths) + 1)]
    units = tuple(zip(starts[:-1], starts[1:], strict=True))
    pieces = [
        ShardLayout(units, replicas, processes, rank).piece_len(k)
        for rank in range(processes)
        for k in range(replicas)
    ]
    assert min(pieces) == pieces[-1]
