"""A rank of `atomr train --distributed` that fails before the ranks agree on
their options still joins that exchange, carrying its error: every rank
stops at once with the same line naming it, instead of waiting for it until
the start-up deadline (120 s). So does rank 0 failing to open its logs,
after the exchange (`Job.none_failed`), instead of leaving the others in
the trainers' first collective until its timeout (120 s)."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atomr.cli.agreement import agree
from atomr.cli.errors import CliError
from atomr.cli.job import MpiJob
from atomr.cli.parser import asks_for_distributed_training, build_parser
from atomr.train.core import load_checkpoint, save_checkpoint
from atomr.train.sharded.checkpoints import split_state, write_index, write_shards
from atomr.train.sharded.layout import ShardLayout
from tests.cli.test_distributed_agreement import TINY, _mpiexec

TRAIN = [sys.executable, "-m", "atomr.cli", "train", "--distributed", *TINY]
QUICK_S = 60.0  # far more than a job that stops at the exchange takes; less than the deadline


class _Ranks:
    """`world_size` ranks in one event loop: each call of `all_gather` meets
    the same call of every other rank, as `MpiCollective`'s does."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._tables: dict[int, dict[int, np.ndarray]] = {}
        self._met: dict[int, asyncio.Event] = {}

    def rank(self, rank: int) -> _Rank:
        return _Rank(self, rank)

    async def meet(self, call: int, rank: int, table: np.ndarray) -> None:
        tables = self._tables.setdefault(call, {})
        met = self._met.setdefault(call, asyncio.Event())
        tables[rank] = table
        if len(tables) == self.world_size:
            size = table.size // self.world_size
            for k, mine in tables.items():
                for other in tables.values():
                    other[k * size : (k + 1) * size] = mine[k * size : (k + 1) * size]
            met.set()
        await met.wait()


class _Rank:
    def __init__(self, ranks: _Ranks, rank: int) -> None:
        self.ranks, self.rank, self.world_size = ranks, rank, ranks.world_size
        self.calls = 0

    async def all_gather(self, table: np.ndarray) -> None:
        self.calls += 1
        await self.ranks.meet(self.calls, self.rank, table)


def _agree_all(mines: list[Mapping[str, Any] | CliError]) -> list[BaseException | None]:
    """What `agree` raises on each rank (None where it returns)."""
    ranks = _Ranks(len(mines))

    async def every_rank() -> list[BaseException | None]:
        exchanges = (agree(ranks.rank(r), mine) for r, mine in enumerate(mines))
        return await asyncio.wait_for(asyncio.gather(*exchanges, return_exceptions=True), 10.0)

    return asyncio.run(every_rank())


def test_a_rank_that_failed_stops_every_rank_with_its_error() -> None:
    options = {"--lr": 0.1, "--seed": 0}
    raised = _agree_all([options, CliError("cannot read x\nsecond line", 1), options])
    expected = "--distributed: rank 1 failed before training: cannot read x second line"
    assert all(isinstance(e, CliError) and str(e) == expected for e in raised), raised
    assert {e.exit_code for e in raised if isinstance(e, CliError)} == {1}


def test_every_failed_rank_is_named_with_the_first_ones_exit_status() -> None:
    raised = _agree_all([CliError("bad --lr"), {"--lr": 0.1}, CliError("no disk", 1)])
    expected = (
        "--distributed: rank 0 failed before training: bad --lr; "
        "rank 2 failed before training: no disk"
    )
    assert all(isinstance(e, CliError) and str(e) == expected for e in raised), raised
    assert {e.exit_code for e in raised if isinstance(e, CliError)} == {2}


def test_ranks_that_agree_go_on_and_those_that_do_not_stop() -> None:
    assert _agree_all([{"--lr": 0.1}, {"--lr": 0.1}]) == [None, None]
    raised = _agree_all([{"--lr": 0.1}, {"--lr": 0.2}])
    assert all(isinstance(e, CliError) and "rank 1 differs from rank 0 in --lr" in str(e)
               for e in raised), raised  # fmt: skip


def test_ranks_comparing_other_options_stop_instead_of_misreading_them() -> None:
    raised = _agree_all([{"--lr": 0.1}, {"--lr": 0.1, "--new": 1}])
    assert all(isinstance(e, CliError) and "compare different options (1, 2 by rank)" in str(e)
               for e in raised), raised  # fmt: skip


def _none_failed_all(errors: list[Exception | None]) -> list[BaseException | None]:
    """What `MpiJob.none_failed` raises on each rank (None where it returns)."""
    ranks = _Ranks(len(errors))

    async def every_rank() -> list[BaseException | None]:
        steps = (MpiJob(ranks.rank(r), r == 0).none_failed(error) for r, error in enumerate(errors))
        return await asyncio.wait_for(asyncio.gather(*steps, return_exceptions=True), 10.0)

    return asyncio.run(every_rank())


def test_a_step_after_the_exchange_failing_on_one_rank_stops_every_rank() -> None:
    assert _none_failed_all([None, None]) == [None, None]
    full = OSError(28, "No space left on device", "m.jsonl")
    raised = _none_failed_all([full, None])
    expected = (
        "--distributed: rank 0 failed before training: "
        "[Errno 28] No space left on device: 'm.jsonl'"
    )
    assert all(isinstance(e, CliError) and str(e) == expected for e in raised), raised
    assert {e.exit_code for e in raised if isinstance(e, CliError)} == {1}


def test_a_bug_after_the_exchange_keeps_its_traceback_and_still_stops_the_others() -> None:
    bug = TypeError("unexpected argument")
    raised = _none_failed_all([bug, None])
    assert raised[0] is bug
    assert isinstance(raised[1], CliError) and str(raised[1]) == (
        "--distributed: rank 0 failed before training: TypeError: unexpected argument"
    )


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["train", "--lr", "abc", "--distributed"], True),
        (["train", "--dist", "--strategy", "nope"], True),
        (["train", "--lr", "abc"], False),
        (["devices", "--distributed"], False),
        (["train", "--distributed=yes"], False),
    ],
)
def test_a_rank_whose_arguments_do_not_parse_is_still_known_as_one(
    argv: list[str], expected: bool
) -> None:
    assert asks_for_distributed_training(argv) is expected


def test_the_prefixes_taken_for_distributed_are_the_parsers_own() -> None:
    parser = build_parser("test")
    for spelling in ("--distributed", "--distrib", "--di"):
        assert parser.parse_args(["train", spelling]).distributed
        assert asks_for_distributed_training(["train", spelling])


def _stopped_alike(code: int, err: str, expected_code: int, line: str) -> None:
    assert code == expected_code, err
    assert err.count(f"atomr: error: {line}") == 2, err  # mpiexec may interleave the writes
    assert not err.replace(f"atomr: error: {line}", "").strip(), err


@pytest.mark.mpi
def test_an_option_only_one_rank_refuses_stops_both_at_once(tmp_path: Path) -> None:
    code, err = _mpiexec(
        1,
        [*TRAIN, "--run-dir", str(tmp_path / "r0"),
         ":", "-n", "1", *TRAIN, "--run-dir", str(tmp_path / "r1"), "--lr", "-1"],
        timeout=QUICK_S,
    )  # fmt: skip
    line = "--distributed: rank 1 failed before training: --lr: lr must be >= 0, got lr=-1.0"
    _stopped_alike(code, err, 2, line)
    assert not (tmp_path / "r0").exists()


@pytest.mark.mpi
def test_arguments_only_one_rank_cannot_parse_stop_both_at_once(tmp_path: Path) -> None:
    code, err = _mpiexec(
        1,
        [*TRAIN, "--run-dir", str(tmp_path / "r0"),
         ":", "-n", "1", *TRAIN, "--run-dir", str(tmp_path / "r1"), "--lr", "abc"],
        timeout=QUICK_S,
    )  # fmt: skip
    line = (
        "--distributed: rank 1 failed before training: argument --lr: invalid float value: "
        "'abc' (see 'atomr train --help')"
    )
    _stopped_alike(code, err, 2, line)


@pytest.mark.mpi
def test_outputs_the_root_cannot_write_stop_both_with_its_exit_status(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    blocked = tmp_path / "file" / "run"
    code, err = _mpiexec(2, [*TRAIN, "--run-dir", str(blocked)], timeout=QUICK_S)
    line = (
        f"--distributed: rank 0 failed before training: --run-dir: cannot write "
        f"{blocked / 'curves.png'}: {tmp_path / 'file'} is not a directory; "
        "choose another --run-dir"
    )
    _stopped_alike(code, err, 1, line)


@pytest.mark.mpi
def test_a_checkpoint_only_one_rank_cannot_read_stops_both_at_once(
    tmp_path: Path, checkpoint: Path
) -> None:
    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(b"not a checkpoint")
    code, err = _mpiexec(
        1,
        [*TRAIN, "--epochs", "2", "--run-dir", str(tmp_path / "r0"), "--resume", str(checkpoint),
         ":", "-n", "1", *TRAIN, "--epochs", "2", "--run-dir", str(tmp_path / "r1"),
         "--resume", str(garbage)],
        timeout=QUICK_S,
    )  # fmt: skip
    assert code == 2, err
    before, *lines = err.split("atomr: error: ")  # mpiexec may interleave the writes
    assert not before.strip() and len(lines) == 2, err
    assert lines[0].strip() == lines[1].strip(), err
    assert lines[0].startswith(
        f"--distributed: rank 1 failed before training: --resume: {garbage}"
    ), err
    assert not (tmp_path / "r0").exists()


@pytest.mark.mpi
def test_ranks_resuming_other_saves_at_one_path_stop_before_training(
    tmp_path: Path, checkpoint: Path
) -> None:
    """The same relative `--resume` path in two working folders, as on two
    hosts, holds two saves of the same step: every rank names --resume."""
    other = load_checkpoint(checkpoint)
    other.weights = other.weights + np.float32(0.5)
    here, there = tmp_path / "host0", tmp_path / "host1"
    for folder in (here, there):
        folder.mkdir()
    shutil.copy(checkpoint, here / "model.ckpt")
    save_checkpoint(there / "model.ckpt", other)
    resume = [*TRAIN, "--epochs", "2", "--resume", "model.ckpt"]
    code, err = _mpiexec(
        1,
        ["-wdir", str(here), *resume, "--run-dir", str(tmp_path / "r0"),
         ":", "-n", "1", "-wdir", str(there), *resume, "--run-dir", str(tmp_path / "r1")],
        timeout=QUICK_S,
    )  # fmt: skip
    line = (
        "--distributed: the ranks were given different options: rank 1 differs from rank 0 "
        "in --resume (every rank of a job must be given the same training options)"
    )
    _stopped_alike(code, err, 2, line)
    assert not (tmp_path / "r0").exists()


def _save_in_shards(checkpoint: Path, path: Path, shift: float) -> None:
    """`checkpoint`, its weights shifted by `shift`, saved one file per
    replica of two (generation 1) with an index at `path`."""
    full = load_checkpoint(checkpoint)
    layout = ShardLayout(((0, full.weights.size),), replicas=2)
    states = split_state(layout, full.weights + np.float32(shift), full.optimizer, full.step)
    write_shards(path, layout, states, full.model, 1, "0" * 32)
    write_index(path, layout, full.step, full.model, full.extra, 1, "0" * 32)


@pytest.mark.mpi
def test_ranks_resuming_other_shard_files_beside_one_index_stop_before_training(
    tmp_path: Path, checkpoint: Path
) -> None:
    """Byte-equal indexes (of one step and generation) beside other shard
    files: before, the index's digest alone was compared, and each rank of
    --strategy zero loaded its own host's weights and trained to the end."""
    here, there = tmp_path / "host0", tmp_path / "host1"
    for folder, shift in ((here, 0.0), (there, 0.5)):
        folder.mkdir()
        _save_in_shards(checkpoint, folder / "model.ckpt", shift)
    assert (here / "model.ckpt").read_bytes() == (there / "model.ckpt").read_bytes()
    resume = [*TRAIN, "--strategy", "zero", "--epochs", "2", "--resume", "model.ckpt"]
    code, err = _mpiexec(
        1,
        ["-wdir", str(here), *resume, "--run-dir", str(tmp_path / "r0"),
         ":", "-n", "1", "-wdir", str(there), *resume, "--run-dir", str(tmp_path / "r1")],
        timeout=QUICK_S,
    )  # fmt: skip
    line = (
        "--distributed: the ranks were given different options: rank 1 differs from rank 0 "
        "in --resume (every rank of a job must be given the same training options)"
    )
    _stopped_alike(code, err, 2, line)
    assert not (tmp_path / "r0").exists()


@pytest.mark.mpi
def test_ranks_resuming_one_save_from_their_own_paths_train_on(
    tmp_path: Path, checkpoint: Path
) -> None:
    mine = tmp_path / "copy.ckpt"
    shutil.copy(checkpoint, mine)
    resume = [*TRAIN, "--epochs", "2", "--run-dir", str(tmp_path / "run")]
    code, err = _mpiexec(
        1,
        [*resume, "--resume", str(checkpoint), ":", "-n", "1", *resume, "--resume", str(mine)],
        timeout=QUICK_S,
    )
    assert code == 0, err
    history = json.loads((tmp_path / "run" / "history.json").read_text())
    assert history["resumed_from"] == str(checkpoint)
    assert [e["epoch"] for e in history["epochs"]] == [2]


@pytest.mark.mpi
def test_a_tensorboard_folder_the_root_cannot_make_stops_both_before_any_file(
    tmp_path: Path,
) -> None:
    """Found by probing the folder before the exchange; it was found when
    rank 0 opened its logs, after it, and rank 1 waited out 120 s."""
    (tmp_path / "file").write_text("")
    board, metrics = tmp_path / "file" / "tb", tmp_path / "m.jsonl"
    outputs = ["--run-dir", str(tmp_path / "run"), "--metrics", str(metrics)]
    code, err = _mpiexec(2, [*TRAIN, *outputs, "--tensorboard", str(board)], timeout=QUICK_S)
    line = (
        f"--distributed: rank 0 failed before training: --tensorboard: cannot write {board}: "
        f"{tmp_path / 'file'} is not a directory; choose another --tensorboard"
    )
    _stopped_alike(code, err, 1, line)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


@pytest.mark.mpi
def test_a_log_the_root_cannot_open_after_the_exchange_stops_both_at_once(
    tmp_path: Path,
) -> None:
    metrics = tmp_path / "m.jsonl"
    script = [sys.executable, str(Path(__file__).with_name("log_failure.py")), *TINY]
    code, err = _mpiexec(
        2, [*script, "--run-dir", str(tmp_path / "run"), "--metrics", str(metrics)],
        timeout=QUICK_S,
    )  # fmt: skip
    line = (
        "--distributed: rank 0 failed before training: --metrics: "
        f"[Errno 28] No space left on device: '{metrics}'"
    )
    _stopped_alike(code, err, 1, line)


@pytest.mark.mpi
def test_ranks_that_load_other_data_with_the_same_options_stop_before_training(
    tmp_path: Path,
) -> None:
    """Rank 1 runs in a folder holding a `pydoc_data` of its own (as a host
    with another Python would), which `python -m` imports before the
    standard library's: its --dataset pydoc is another text. Both ranks
    trained on their own text before."""
    here, there = tmp_path / "host0", tmp_path / "host1"
    (there / "pydoc_data").mkdir(parents=True)
    here.mkdir()
    text = "The quick brown fox jumps over the lazy dog. " * 40
    (there / "pydoc_data" / "__init__.py").write_text("")
    (there / "pydoc_data" / "topics.py").write_text(f"topics = {{'fox': {text!r}}}\n")
    gpt = [sys.executable, "-m", "atomr.cli", "train", "--distributed", "--quiet",
           "--model", "gpt", "--dataset", "pydoc", "--context", "8", "--n-layer", "1",
           "--n-head", "1", "--d-model", "8", "--epochs", "1", "--batch-size", "16",
           "--devices", "1"]  # fmt: skip
    code, err = _mpiexec(
        1,
        ["-wdir", str(here), *gpt, "--run-dir", str(tmp_path / "r0"),
         ":", "-n", "1", "-wdir", str(there), *gpt, "--run-dir", str(tmp_path / "r1")],
        timeout=QUICK_S,
    )  # fmt: skip
    line = (
        "--distributed: the ranks were given different options: rank 1 differs from rank 0 "
        "in --dataset (the data loaded) (every rank of a job must be given the same training "
        "options; each rank loads --dataset itself (pydoc from its Python's documentation, "
        "digits from its scikit-learn, synthetic with its numpy): install the same versions "
        "on every host)"
    )
    _stopped_alike(code, err, 2, line)
    assert not (tmp_path / "r0").exists()
