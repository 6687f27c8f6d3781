"""The operation check of `MpiCollective` (`_order.py`): ranks at different
operations all raise `CollectiveMismatchError` naming every rank's
operation, at once and before any of them runs it; the collective is broken
afterwards. Matching operations: `test_collective.py` (results) and the
missing-rank tests there (`CollectiveTimeoutError`, now raised while the
check waits)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from atomr.train.comm.mpi._order import describe_signature, signature_of
from tests.train.mpi_scripts.harness import run_script

# a mismatch is found by one small exchange: far below the collective's timeout
TIMEOUT_S = 20.0
QUICK_S = 2.0

EXPECTED = {  # scenario -> (the other ranks' operation, rank 1's)
    "kind": ("all_reduce #3 (1024 float32)", "broadcast #3 (1024 float32, root 0)"),
    "size": ("all_reduce #3 (1024 float32)", "all_reduce #3 (2048 float32)"),
    "ahead": ("all_reduce #3 (100 float32)", "all_reduce #3 (200 float32)"),
    "dtype": ("all_gather #3 (1024 float32)", "all_gather #3 (1024 float64)"),
    "purpose": (
        "all_reduce #4 (1024 float32, for 'step')",
        "all_reduce #4 (1024 float32, for 'save checkpoint')",
    ),
    "op": ("all_reduce #3 (1024 float32)", "all_reduce #3 (1024 float32, mean of 1 a rank)"),
    "contributions": (
        "reduce_scatter #3 (1024 float32, mean of 1 a rank)",
        "reduce_scatter #3 (1024 float32, mean of 2 a rank)",
    ),
}


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_ranks_at_different_operations_all_raise_at_once(n: int, tmp_path) -> None:
    result, _ = run_script(n, "out_of_step.py", tmp_path, TIMEOUT_S, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(n)]
    for scenario, (usual, odd) in EXPECTED.items():
        operations = [odd if r == 1 else usual for r in range(n)]
        listed = ", ".join(
            f"rank {r} is at {op}" if r == 0 else f"rank {r} at {op}"
            for r, op in enumerate(operations)
        )
        for rank, report in enumerate(r[scenario] for r in reports):
            where = (scenario, rank, report)
            assert report["error"].startswith("CollectiveMismatchError: "), where
            assert f"on rank {rank} of {n}: {listed}; no rank ran it" in report["error"], where
            assert report["operations"] == operations, where
            assert report["ranks"] == ([1] if rank != 1 else [r for r in range(n) if r != 1])
            assert report["operation"] == operations[rank].split(" (")[0], where
            assert report["elapsed_s"] < QUICK_S, where
            assert report["untouched"], where  # the operation never ran
            assert report["broken"], where
            assert report["later"].startswith(
                "RankFailedError: collective unusable after an earlier failure: "
                f"MPI operations out of step on rank {rank}"
            ), where
            assert report["later_s"] < 0.5, where
    for rank, report in enumerate(reports):
        assert report["disagreeing_option"] == (
            "check_order must be the same on every rank; rank 1 turned it off and the "
            f"others did not (rank {rank} has it {'off' if rank == 1 else 'on'})"
        )
        assert report["unchecked_sum_ok"], report


@pytest.mark.mpi
def test_a_lone_save_meeting_a_step_is_refused_on_both_ranks(tmp_path) -> None:
    """The bug that motivated the check (see `mpi_scripts/lone_save.py`):
    before it, rank 1's save "succeeded" in 16 ms, no file held it, rank 0's
    step timed out and the job ended with a segmentation fault."""
    result, _ = run_script(2, "lone_save.py", tmp_path, TIMEOUT_S, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for rank, report in enumerate(reports):
        assert report["errors"], (rank, report)  # neither the save nor the step passed
        assert any(
            e.startswith("CollectiveMismatchError: MPI operations out of step on rank ")
            and "rank 0 is at reduce_scatter #" in e
            and ", rank 1 at all_reduce #" in e
            for e in report["errors"]
        ), (rank, report)
        assert report["elapsed_s"] < QUICK_S, (rank, report)
    assert not (tmp_path / "lone.ckpt").exists()


@pytest.mark.mpi
def test_a_lone_save_meeting_a_step_of_the_same_shape_is_refused_by_purpose(tmp_path) -> None:
    """A `DataParallelTrainer`'s save agreement and its step scalars are both
    an all-reduce of 2 float64; before purposes, rank 1's save summed rank
    0's loss into its agreement (a false "process failed" or a lost save)
    and rank 0's step then waited out the timeout for its gradients."""
    result, _ = run_script(2, "lone_save.py", tmp_path, TIMEOUT_S, "data_parallel", timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for rank, report in enumerate(reports):
        assert report["errors"], (rank, report)
        assert any(
            e.startswith("CollectiveMismatchError: MPI operations out of step on rank ")
            and "rank 0 is at all_reduce #" in e
            and " (2 float64, for 'step scalars'), rank 1 at all_reduce #" in e
            and " (2 float64, for 'save checkpoint')" in e
            for e in report["errors"]
        ), (rank, report)
        assert report["elapsed_s"] < QUICK_S, (rank, report)
    assert not (tmp_path / "lone.ckpt").exists()


def test_signatures_in_words() -> None:
    buf = np.zeros(1024, np.float32)
    assert describe_signature((7, 0, *signature_of(buf))) == "all_reduce #7 (1024 float32)"
    assert (
        describe_signature((2, 3, *signature_of(np.zeros(3, np.complex128), 1)))
        == "broadcast #2 (3 complex128, root 1)"
    )
    assert describe_signature((4, 2, *signature_of(np.zeros(5, np.bool_)))) == (
        "all_gather #4 (5 bool)"
    )
    assert describe_signature((9, 4, *signature_of(None))) == "barrier #9"
    assert describe_signature((9, 17, 0, 0, -1, 0)) == "an unknown operation #9 (code 17)"
    assert describe_signature((5, 1, *signature_of(np.zeros(8), mean=2))) == (
        "reduce_scatter #5 (8 float64, mean of 2 a rank)"
    )
    # the dtype's kind and size, not NumPy's type number: int64 is one
    # dtype whether it was made as "l" or "q"
    assert signature_of(np.zeros(1, "l")) == signature_of(np.zeros(1, "q"))


def test_check_order_must_be_a_bool() -> None:
    """`check_order="no"` would be truthy: refused before MPI is touched; a
    world of one runs no check either way."""
    pytest.importorskip("mpi4py")
    import asyncio

    from atomr.train.comm.mpi.collective import MpiCollective

    with pytest.raises(TypeError, match="check_order must be a bool, got 'no'"):
        MpiCollective(timeout=5.0, check_order="no")  # type: ignore[arg-type]

    async def go() -> None:
        for check in (True, False):
            coll = MpiCollective(timeout=5.0, check_order=check)
            buf = np.arange(4.0)
            assert await coll.all_reduce(buf) is buf
            await coll.barrier()
            assert not coll.broken
            coll.close()

    asyncio.run(go())


def test_from_config_passes_check_order_on() -> None:
    """`from_config(config, check_order=...)` reaches the constructor (on by
    default), and is type-checked there before MPI is touched."""
    pytest.importorskip("mpi4py")
    from typing import Any

    from atomr.train.comm.mpi.collective import MpiCollective
    from atomr.train.comm.mpi.job import DistributedTrainConfig

    config = DistributedTrainConfig(collective_timeout=5.0)
    with pytest.raises(TypeError, match="check_order must be a bool, got 1"):
        MpiCollective.from_config(config, check_order=1)  # type: ignore[arg-type]

    given: list[bool] = []

    class Spied(MpiCollective):
        def __init__(self, comm: Any = None, **options: Any) -> None:
            given.append(options["check_order"])
            super().__init__(comm, **options)

    for check in ({}, {"check_order": False}, {"check_order": True}):
        coll = Spied.from_config(config, **check)
        assert (coll.rank, coll.world_size, coll.timeout) == (0, 1, 5.0)
        coll.close()
    assert given == [True, False, True]
