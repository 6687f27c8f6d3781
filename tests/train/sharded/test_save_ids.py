"""A sharded save's id: 32 random hex digits chosen by process 0 for each
save, held by its index and by every shard file of it, so that another
save's shard file of the same step and generation is refused, not merged
(`atomr.train.core.sharded_index`). Saves from before ids still load."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from atomr import ActorSystem
from atomr.train import CheckpointError, SaveCheckpoint, load_checkpoint
from atomr.train.core.checkpoint import save_checkpoint
from atomr.train.sharded import merge_shards
from atomr.train.sharded._checkpointing import shared_save_id
from atomr.train.sharded.checkpoints import shard_path
from tests.train.mpi_scripts.harness import run_script
from tests.train.sharded.test_checkpoints import _sharded, _steps


async def _two_saves_of_one_step(tmp_path: Path) -> tuple[Path, Path]:
    """The indexes of two trainers' saves (other data) of the same step and
    generation, in two folders."""
    paths = tmp_path / "a" / "s.ckpt", tmp_path / "b" / "s.ckpt"
    async with ActorSystem("zero-ckpt") as system:
        for seed, path in enumerate(paths):
            path.parent.mkdir()
            writer = await _sharded(system, 2, stage=1, shard_checkpoints=True)
            await _steps(writer, seed)
            await writer.ask(SaveCheckpoint(path))
    return paths


async def test_a_shard_file_of_another_save_of_the_same_step_is_refused(tmp_path: Path) -> None:
    """An index names its shards by count and generation: another save's
    shard file put beside it (same step, same generation) was merged in
    silently, half of one run's weights and half of another's."""
    here, there = await _two_saves_of_one_step(tmp_path)
    shard = shard_path(there, 1, 2, generation=1)
    assert merge_shards(here).step == merge_shards(there).step
    shutil.copyfile(shard, shard_path(here, 1, 2, generation=1))
    with pytest.raises(CheckpointError, match="shard 1 of .* is of another save"):
        merge_shards(here)


async def test_a_sharded_save_from_before_save_ids_still_loads(tmp_path: Path) -> None:
    here, _ = await _two_saves_of_one_step(tmp_path)
    merged = merge_shards(here)
    for name in [here, *(shard_path(here, g, 2, generation=1) for g in range(2))]:
        old = load_checkpoint(name)
        info = old.extra.get("sharded", old.extra)
        del info["save"]  # the index's, or a shard's
        save_checkpoint(name, old)
    again = merge_shards(here)
    np.testing.assert_array_equal(again.weights, merged.weights)
    assert again.step == merged.step


class _TwoProcesses:
    """The `broadcast` of a two-process collective, both ends in this event loop."""

    def __init__(self) -> None:
        self.sent: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()

    async def broadcast(self, buffers: list[np.ndarray], root: int = 0) -> None:
        if not self.sent.done():  # rank 0 calls first (gathered in rank order)
            self.sent.set_result(buffers[root].copy())
        else:
            buffers[0][:] = await self.sent


async def test_every_process_writes_process_0s_save_id() -> None:
    ids = []
    for _ in range(2):
        pair = _TwoProcesses()
        ids.append(await asyncio.gather(*(shared_save_id(pair, r) for r in (0, 1))))  # type: ignore[arg-type]
    assert ids[0][0] == ids[0][1] and ids[1][0] == ids[1][1]  # one save's, on every process
    assert ids[0][0] != ids[1][0] and len(ids[0][0]) == 32  # a new one for each save
    assert await shared_save_id(None, 0) != await shared_save_id(None, 0)  # one process


@pytest.mark.mpi
def test_a_save_of_two_processes_loads_and_refuses_another_saves_shard(tmp_path: Path) -> None:
    """Each process writes its own replica's shard file, holding process 0's
    save id (`shared_save_id`'s broadcast across a real job): the save loads
    in the job and here, and a shard file of another save of the same step
    and generation is refused, in the job (every process keeps its
    weights) and here."""
    result, _ = run_script(2, "sharded_save_ids.py", tmp_path, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    ids = {}
    for name in ("a", "b"):
        index = tmp_path / name / "s.ckpt"
        saved = load_checkpoint(index).extra["sharded"]["save"]
        shards = [load_checkpoint(shard_path(index, g, 2, 1)).extra["save"] for g in (0, 1)]
        assert shards == [saved, saved], (name, shards, saved)  # rank 1's too
        ids[name] = saved
    assert ids["a"] != ids["b"]
    weights = np.load(tmp_path / "rank0_a.npy")
    np.testing.assert_array_equal(merge_shards(tmp_path / "a" / "s.ckpt").weights, weights)
    for rank in (0, 1):
        np.testing.assert_array_equal(np.load(tmp_path / f"rank{rank}_loaded.npy"), weights)
        np.testing.assert_array_equal(np.load(tmp_path / f"rank{rank}_after.npy"), weights)
        report = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert report["type"] == "CheckpointError", report
        assert re.search(r"shard 1 of .*mixed\d.* is of another save", report["message"]), report
        with pytest.raises(CheckpointError, match=f"shard 1 of .*mixed{rank}.* is of another save"):
            merge_shards(tmp_path / f"mixed{rank}" / "s.ckpt")
