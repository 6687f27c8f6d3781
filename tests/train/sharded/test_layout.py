"""`ShardLayout`: every position of the vector is owned exactly once across
the job, one process's owners are the chunks its collective's
reduce-scatter leaves each replica, and pieces round-trip."""

from __future__ import annotations

import numpy as np
import pytest

from atomr.train import Mlp
from atomr.train.core.partition import split_bounds
from atomr.train.sharded import ShardLayout

WHOLE = ((0, 26),)
LAYERS = ((0, 18), (18, 18), (18, 26))  # Mlp([5, 3, 2]): Linear, Activation (no parameters), Linear


@pytest.mark.parametrize("units", [WHOLE, LAYERS], ids=["whole", "layers"])
@pytest.mark.parametrize(("processes", "replicas"), [(1, 1), (1, 3), (2, 2), (3, 4), (2, 5)])
def test_every_position_is_owned_exactly_once(units, processes: int, replicas: int) -> None:
    # 26 parameters: no N divides it
    covered = np.zeros(26, dtype=int)
    for rank in range(processes):
        layout = ShardLayout(units, replicas, processes, rank)
        for k in range(replicas):
            for lo, hi in layout.owned(k):
                covered[lo:hi] += 1
            assert layout.piece_len(k) == sum(hi - lo for lo, hi in layout.owned(k))
    assert (covered == 1).all()


def test_one_process_owns_what_the_collective_scatters() -> None:
    layout = ShardLayout(((0, 26),), 4)
    assert [layout.owned(k)[0] for k in range(4)] == split_bounds(26, 4)


def test_stage_3_units_are_the_top_level_layers() -> None:
    model = Mlp([5, 3, 2])
    layout = ShardLayout.for_model(model, stage=3, replicas=2)
    assert layout.units == LAYERS == tuple(model.layer_ranges())
    assert ShardLayout.for_model(model, stage=2, replicas=2).units == ((0, model.n_params),)


def test_take_put_and_assemble_round_trip() -> None:
    layout = ShardLayout(LAYERS, 3)
    full = np.arange(26, dtype=np.float32)
    pieces = [layout.take(full, k) for k in range(3)]
    assert sum(p.size for p in pieces) == 26
    np.testing.assert_array_equal(layout.assemble(pieces, np.dtype(np.float32)), full)
    with pytest.raises(ValueError, match="owns"):
        layout.put(full.copy(), 0, pieces[0][:-1])


def test_a_replica_may_own_nothing_of_a_short_unit() -> None:
    layout = ShardLayout(((0, 2), (2, 9)), 4)
    assert layout.owned(3)[0] == (2, 2)  # empty part of the 2-long unit
    assert layout.piece_len(3) == 1


def test_a_huge_job_is_refused_without_a_list_of_its_processes() -> None:
    """Each process's chunk was `split_bounds(unit_len, P)[rank]`: a list of
    P bounds per call, so refusing 10**6 processes took seconds and 10**18
    failed with a MemoryError. One chunk is now computed directly."""
    model = Mlp([5, 3, 2])  # 26 parameters
    with pytest.raises(ValueError, match="replica 0 of process 26 would own none"):
        ShardLayout.for_model(model, stage=2, replicas=1, processes=10**18)
    layout = ShardLayout(WHOLE, 2, 10**18, 25)
    assert layout.process_chunk(26) == (25, 26)
    assert layout.owned(0) == [(25, 26)] and layout.owned(1) == [(26, 26)]
