"""The number of processes of a job is an MPI world size, which MPI numbers
with C ints: `MAX_PROCESSES` (2**31 - 1) bounds it wherever it is given, so
that `process_count=10**12` is refused naming it, where it was taken and the
first multi-process `Step` cut its batch into 10**12 shares (a MemoryError)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from atomr.train.comm import HostCollective
from atomr.train.comm.mpi.job import MAX_PROCESSES, DistributedTrainConfig
from atomr.train.data_parallel.options import DataParallelOptions
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
