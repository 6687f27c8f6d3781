"""The ranks of `atomr train --distributed` agree on their options before
anything is built, and a rank lost while the trainer starts ends the job."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

from atomr.cli.agreement import (
    LOADED_DATA,
    RESUMED_AT,
    disagreement,
    option_digests,
    shared_options,
)
from atomr.cli.dataset import Dataset, data_digest, load_dataset
from atomr.cli.parser import build_parser
from atomr.cli.run_config import RunConfig
from atomr.cli.training_run import RunStart
from atomr.train.core.text import CharVocab
from atomr.train.fit import FitPosition
from tests.train.mpi_scripts.harness import require_mpi

ROOT = Path(__file__).resolve().parents[2]
TINY = [
    "--dataset", "synthetic", "--samples", "64", "--features", "4", "--classes", "2",
    "--hidden", "4", "--epochs", "1", "--batch-size", "16", "--devices", "1", "--quiet",
]  # fmt: skip


def _run_config(*argv: str) -> RunConfig:
    return RunConfig.from_args(build_parser("test").parse_args(["train", *TINY, *argv]))


FRESH = RunStart(steps=3, updates=3)


def _table(*runs: RunConfig | tuple[RunConfig, RunStart]) -> tuple[list[str], np.ndarray]:
    options = [
        shared_options(*run) if isinstance(run, tuple) else shared_options(run, FRESH)
        for run in runs
    ]
    return list(options[0]), np.stack([option_digests(o) for o in options])


def test_ranks_that_differ_only_in_their_own_outputs_agree() -> None:
    flags, table = _table(
        _run_config("--run-dir", "a", "--checkpoint", "x/c.ckpt"),
        _run_config("--run-dir", "b", "--checkpoint", "y/c.ckpt", "--metrics", "m.jsonl"),
    )
    assert disagreement(flags, table) is None


def test_a_disagreement_names_the_rank_and_the_options() -> None:
    flags, table = _table(
        _run_config(),
        _run_config(),
        _run_config("--seed", "5", "--lr", "0.05"),
        _run_config("--hidden", "8"),
        _run_config("--checkpoint", "c.ckpt"),
    )
    message = disagreement(flags, table)
    assert message is not None and "\n" not in message
    assert "rank 1 " not in message
    assert "rank 2 differs from rank 0 in --lr, --seed;" in message
    assert "rank 3 differs from rank 0 in --hidden;" in message
    assert "rank 4 differs from rank 0 in --checkpoint " in message


def test_every_model_data_and_optimizer_option_is_compared() -> None:
    flags = set(shared_options(_run_config(), FRESH))
    assert {"--seed", "--lr", "--hidden", "--strategy", "--samples", "--epochs"} <= flags
    assert {"--devices", "--checkpoint", "--resume", RESUMED_AT, LOADED_DATA} <= flags
    assert not {"--run-dir", "--quiet", "--metrics", "--name", "--plot"} & flags


def test_ranks_of_another_model_compare_the_same_options() -> None:
    """Every rank sends one digest per option: a GPT rank and an MLP rank
    sent 35 and 30, and the exchange failed instead of naming --model."""
    mlp, gpt = (
        RunConfig.from_args(build_parser("test").parse_args(["train", "--quiet", *model]))
        for model in ([], ["--model", "gpt"])
    )
    assert list(shared_options(mlp, FRESH)) == list(shared_options(gpt, FRESH))
    table = np.stack([option_digests(shared_options(r, FRESH)) for r in (mlp, gpt)])
    message = disagreement(list(shared_options(mlp, FRESH)), table)
    assert message is not None and "--model" in message and "--n-layer" in message


def _resumed(path: Path, digest: str, position: FitPosition) -> tuple[RunConfig, RunStart]:
    path.write_bytes(b"")  # the options check only that it is a file
    return _run_config("--resume", str(path)), RunStart(3, 3, position, digest)


def test_ranks_resuming_one_save_from_their_own_paths_agree(tmp_path: Path) -> None:
    at = FitPosition(1, 0, 3)
    flags, table = _table(
        _resumed(tmp_path / "a.ckpt", "d1", at), _resumed(tmp_path / "b.ckpt", "d1", at)
    )
    assert disagreement(flags, table) is None


def test_ranks_resuming_other_saves_differ_in_resume(tmp_path: Path) -> None:
    """Another file, or the same path holding another save on another host."""
    at = FitPosition(1, 0, 3)
    path = tmp_path / "a.ckpt"
    flags, table = _table(_resumed(path, "d1", at), _resumed(path, "d2", at))
    message = disagreement(flags, table)
    assert message is not None and "rank 1 differs from rank 0 in --resume (every" in message


def test_ranks_resuming_one_save_at_other_positions_differ_in_its_history(
    tmp_path: Path,
) -> None:
    path = tmp_path / "a.ckpt"
    flags, table = _table(
        _resumed(path, "d1", FitPosition(1, 0, 3)), _resumed(path, "d1", FitPosition(0, 2, 3))
    )
    message = disagreement(flags, table)
    assert message is not None and f"rank 1 differs from rank 0 in {RESUMED_AT} (" in message


def test_the_data_digest_tells_another_load_by_any_array_value_or_vocabulary() -> None:
    data = load_dataset(_run_config())
    again = load_dataset(_run_config())
    assert data_digest(data) == data_digest(again)
    x_test = data.x_test.copy()
    x_test[-1, -1] += 1.0
    others = [
        Dataset(data.name, data.x_train, data.y_train, x_test, data.y_test, data.classes),
        Dataset(data.name, data.x_train[1:], data.y_train[1:], data.x_test, data.y_test, 2),
        Dataset(data.name, *(a.astype(np.float64) for a in (data.x_train,)), data.y_train,
                data.x_test, data.y_test, data.classes),
        Dataset(data.name, data.x_train, data.y_train, data.x_test, data.y_test, 2,
                CharVocab("ab")),
    ]  # fmt: skip
    assert len({data_digest(d) for d in [data, *others]}) == 5


def test_ranks_that_loaded_other_data_with_the_same_options_name_dataset() -> None:
    """Same options, another pydoc or scikit-learn on a host: one line, naming
    --dataset and what to do; ranks given other options are told those."""
    run = _run_config()
    flags, table = _table((run, RunStart(3, 3, data="d1")), (run, RunStart(3, 3, data="d2")))
    assert disagreement(flags, table) == (
        "--distributed: the ranks were given different options: rank 1 differs from rank 0 "
        f"in {LOADED_DATA} (every rank of a job must be given the same training options; "
        "each rank loads --dataset itself (pydoc from its Python's documentation, digits "
        "from its scikit-learn, synthetic with its numpy): install the same versions on "
        "every host)"
    )
    other = _run_config("--seed", "5")
    flags, table = _table((run, RunStart(3, 3, data="d1")), (other, RunStart(3, 3, data="d2")))
    message = disagreement(flags, table)
    assert message is not None and "differs from rank 0 in --seed (" in message
    assert "--dataset" not in message


def test_a_table_of_the_wrong_shape_is_refused() -> None:
    with pytest.raises(ValueError, match="one row of 2 digests per rank"):
        disagreement(["--a", "--b"], np.zeros((2, 3)))


def _mpiexec(n: int, program: list[str], timeout: float = 100.0) -> tuple[int, str]:
    require_mpi()
    from atomr.train.comm.mpi.launch import run_mpiexec

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = run_mpiexec(n, program, timeout=timeout, env=env, capture=True)
    return result.returncode, result.stderr


@pytest.mark.mpi
def test_ranks_given_different_seeds_stop_with_one_line_each(tmp_path: Path) -> None:
    train = [sys.executable, "-m", "atomr.cli", "train", "--distributed", *TINY]
    code, err = _mpiexec(
        1,
        [*train, "--run-dir", str(tmp_path / "r0"), "--seed", "0",
         ":", "-n", "1", *train, "--run-dir", str(tmp_path / "r1"), "--seed", "5"]
    )  # fmt: skip
    expected = (
        "atomr: error: --distributed: the ranks were given different options: "
        "rank 1 differs from rank 0 in --seed (every rank of a job must be given the same "
        "training options)"
    )
    assert code == 2, err
    assert err.count(expected) == 2, err  # mpiexec may interleave the ranks' writes
    assert not err.replace(expected, "").strip(), err
    assert not (tmp_path / "r0").exists()


@pytest.mark.mpi
def test_a_rank_lost_in_the_initial_broadcast_aborts_the_job(tmp_path: Path) -> None:
    script = [sys.executable, str(Path(__file__).with_name("spawn_failure.py"))]
    args = [*TINY, "--strategy", "single", "--run-dir", str(tmp_path / "r")]
    code, err = _mpiexec(2, [*script, *args])
    assert code == 2, err
    assert "Traceback" not in err
    reports = [line for line in err.splitlines() if line.startswith("[rank ")]
    assert reports and all("Error: MPI " in line for line in reports), err
