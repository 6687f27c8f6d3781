"""The tensor-parallel partition math (atomr/train/tensor_parallel/sharding.py)."""

from __future__ import annotations

import numpy as np
import pytest

from atomr.train import Mlp
from atomr.train.tensor_parallel.sharding import (
    COLUMN,
    ROW,
    check_shardable,
    scatter_pieces,
    shard_layout,
    split_range,
    stage_count,
)


def test_split_range_is_uneven_but_complete() -> None:
    assert [split_range(10, 4, r) for r in range(4)] == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert [split_range(4, 4, r) for r in range(4)] == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert split_range(7, 1, 0) == (0, 7)
    with pytest.raises(ValueError, match="smaller than the shard count"):
        split_range(3, 4, 0)
    with pytest.raises(ValueError, match="rank"):
        split_range(8, 4, 4)


@pytest.mark.parametrize("sizes", [[5, 7, 3], [6, 11, 9, 5], [4, 10, 6, 9, 7], [3, 5]])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_layouts_partition_the_flat_vector(sizes: list[int], n: int) -> None:
    total = Mlp.param_count(sizes)
    layouts = [shard_layout(sizes, n, r) for r in range(n)]
    index = np.concatenate([lay.global_index() for lay in layouts])
    assert sorted(index.tolist()) == list(range(total))
    for lay in layouts:
        assert lay.global_index().shape == (lay.n_params,)
        assert lay.total_params == total
        assert lay.stages == stage_count(len(sizes) - 1)
        kinds = [ls.kind for ls in lay.layers]
        assert kinds == [COLUMN if i % 2 == 0 else ROW for i in range(len(sizes) - 1)]
        # the row-parallel bias is held by shard 0 only
        for ls in lay.layers:
            if ls.kind == ROW:
                assert ls.b_size == (sizes[ls.layer + 1] if lay.rank == 0 else 0)
        assert lay.layers[-1].gathered == (len(sizes) % 2 == 0)


def test_global_index_points_at_the_owned_blocks() -> None:
    sizes = [3, 5, 2]
    model = Mlp(sizes, seed=0)
    p = model.get_params()
    lay = shard_layout(sizes, 2, 1)  # columns 3:5 of W0, rows 3:5 of W1, no b1
    local = p[lay.global_index()]
    w0 = model.weights(0)[:, 3:5].ravel()
    b0 = model.bias(0)[3:5]
    w1 = model.weights(1)[3:5, :].ravel()
    np.testing.assert_array_equal(local, np.concatenate([w0, b0, w1]))


def test_parameters_per_shard_fall_as_one_over_n() -> None:
    sizes = [64, 256, 256, 64]
    total = Mlp.param_count(sizes)
    for n in (1, 2, 4):
        most = max(shard_layout(sizes, n, r).n_params for r in range(n))
        # everything is split except the row-parallel bias (256 values, on shard 0)
        assert most <= total / n + 256


def test_width_smaller_than_shard_count_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="layer 0 is column-parallel and has 3 output features"):
        check_shardable([8, 3, 8], 4)
    with pytest.raises(ValueError, match="layer 2"):
        check_shardable([8, 8, 8, 2], 4)  # odd depth: the last layer is split too
    check_shardable([8, 8, 2], 4)  # a row-parallel output is not split
    with pytest.raises(ValueError, match="shard_count"):
        check_shardable([8, 8], 0)
    check_shardable([8, 8, 2], np.int64(4))  # type: ignore[arg-type]  # NumPy's ints are ints


def test_a_rank_is_an_int_in_range() -> None:
    assert shard_layout([8, 8, 2], 2, np.int64(1)) == shard_layout([8, 8, 2], 2, 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="rank must be an int"):
        shard_layout([8, 8, 2], 2, True)  # type: ignore[arg-type]  # a bool is no rank
    with pytest.raises(ValueError, match="rank must be"):
        shard_layout([8, 8, 2], 2, 2)
    with pytest.raises(ValueError, match="rank must be"):
        shard_layout([8, 8, 2], 2, -1)
    with pytest.raises(TypeError, match="shard_count must be an int"):
        check_shardable([8, 8], 2.0)  # type: ignore[arg-type]


def test_scatter_pieces_checks_coverage() -> None:
    idx = np.array([0, 2]), np.array([1])
    out = scatter_pieces(3, [(idx[0], np.array([1.0, 3.0])), (idx[1], np.array([2.0]))])
    np.testing.assert_array_equal(out, [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="1 positions missing"):
        scatter_pieces(3, [(idx[0], np.array([1.0, 3.0]))])
    with pytest.raises(ValueError, match="more than once"):
        scatter_pieces(2, [(np.array([0, 1]), np.ones(2)), (np.array([1]), np.ones(1))])


def test_a_row_linear_without_its_column_partner_says_what_stands_between() -> None:
    from atomr.train.core.model import Activation, Dropout, Linear
    from atomr.train.tensor_parallel.shard_plan import rules_for

    layers = [
        Linear(6, 8, tp="column"),
        Activation("relu"),
        Dropout(0.3, seed=2),
        Linear(8, 3, tp="row"),
    ]
    with pytest.raises(ValueError, match=r"layer\(s\) 2 \(Dropout\) stand between it and the "):
        rules_for(layers, 2)
    with pytest.raises(ValueError, match="must follow a column-parallel one"):
        rules_for([Linear(6, 8, tp="row")], 2)
    two_rows = [Linear(6, 8, tp="column"), Linear(8, 8, tp="row"), Linear(8, 3, tp="row")]
    with pytest.raises(ValueError, match="layer 2: .* feeds row-parallel layer 1"):
        rules_for(two_rows, 2)
    assert len(rules_for([*layers[:2], layers[3], layers[2]], 2)) == 4  # dropout after: fine
