"""Sharded checkpoints: the full format moves between the sharded trainer (any
stage, any replica count) and the single-device `Trainer` both ways; the
one-file-per-replica option merges back on load, into another stage and
replica count and into any trainer; a missing shard is refused with nothing
changed; a save's digest covers its shard files."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atomr import ActorRef, ActorSystem
from atomr._arguments import INDEX_MAX
from atomr.accel import cpu_devices
from atomr.train import (
    CheckpointError,
    GetWeights,
    LoadCheckpoint,
    LossKind,
    Mlp,
    OptimizerKind,
    SaveCheckpoint,
    ShardedDataParallelTrainer,
    ShardedOptions,
    Step,
    TensorParallelTrainer,
    Trainer,
    TrainerConfig,
    load_checkpoint,
)
from atomr.train.core.checkpoint import (
    Checkpoint,
    check_model_matches,
    checkpoint_digest,
    save_checkpoint,
)
from atomr.train.sharded import merge_shards
from atomr.train.sharded.checkpoints import (
    next_generation,
    save_digest,
    shard_path,
    split_state,
    write_index,
    write_shards,
)
from atomr.train.sharded.layout import ShardLayout
from atomr.train.sharded.messages import ShardReplicaState

SIZES = [6, 10, 4]
SAVE_ID = "5a" * 16
"""The save id of the saves written here by hand (every one the same, as two
runs' saves of the same step and generation would be without ids)."""
CONFIG = TrainerConfig(OptimizerKind.adamw(0.02), LossKind.CROSS_ENTROPY, gradient_clip=1.0)


def _batches(n: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        (rng.standard_normal((11, SIZES[0])).astype(np.float32), rng.integers(0, 4, 11))
        for _ in range(n)
    ]


async def _steps(ref: ActorRef, seed: int) -> list[float]:
    return [(await ref.ask(Step(x, y))).loss for x, y in _batches(5, seed)]


def writer_model() -> Mlp:
    return Mlp(SIZES, seed=2)


async def _sharded(system: ActorSystem, n: int, **options: Any) -> ActorRef:
    model = Mlp(SIZES, seed=2)
    return await ShardedDataParallelTrainer.spawn(
        system, model, cpu_devices(n), CONFIG, ShardedOptions(**options)
    )


@pytest.mark.parametrize("stage", [1, 2, 3])
async def test_the_full_format_moves_both_ways(stage: int, tmp_path: Path) -> None:
    async with ActorSystem("zero-ckpt") as system:
        sharded = await _sharded(system, 3, stage=stage)
        single = await Trainer.spawn(system, Mlp(SIZES, seed=2), ["cpu:0"], CONFIG)
        await _steps(sharded, 1)
        await sharded.ask(SaveCheckpoint(tmp_path / "zero.ckpt"))
        assert load_checkpoint(tmp_path / "zero.ckpt").step == 5
        await single.ask(LoadCheckpoint(tmp_path / "zero.ckpt"))
        np.testing.assert_array_equal(
            await single.ask(GetWeights()), await sharded.ask(GetWeights())
        )
        # on from the same state, optimizer moments included
        ref_losses, losses = await _steps(single, 2), await _steps(sharded, 2)
        np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
        await single.ask(SaveCheckpoint(tmp_path / "single.ckpt"))
        other = await _sharded(system, 2, stage=4 - stage if stage != 2 else 2)
        await other.ask(LoadCheckpoint(tmp_path / "single.ckpt"))
        np.testing.assert_array_equal(await other.ask(GetWeights()), await single.ask(GetWeights()))
        np.testing.assert_allclose(await _steps(other, 3), await _steps(single, 3), rtol=1e-5)


async def test_one_file_per_replica_merges_into_another_layout(tmp_path: Path) -> None:
    path = tmp_path / "sharded.ckpt"
    async with ActorSystem("zero-ckpt") as system:
        writer = await _sharded(system, 3, stage=3, shard_checkpoints=True)
        await _steps(writer, 1)
        await writer.ask(SaveCheckpoint(path))
        assert all(shard_path(path, g, 3, generation=1).is_file() for g in range(3))
        with pytest.raises(CheckpointError, match="merge_shards"):  # the index alone
            model = Mlp(SIZES)
            check_model_matches(load_checkpoint(path), model.config(), model.n_params, model.dtype)
        merged = merge_shards(path)
        np.testing.assert_array_equal(merged.weights, await writer.ask(GetWeights()))
        assert merged.step == 5 and merged.optimizer["step"] == 5
        single = await Trainer.spawn(system, Mlp(SIZES, seed=2), ["cpu:0"], CONFIG)
        await single.ask(LoadCheckpoint(path))  # every trainer merges it
        np.testing.assert_array_equal(await single.ask(GetWeights()), merged.weights)
        reader = await _sharded(system, 2, stage=1)
        await reader.ask(LoadCheckpoint(path))
        np.testing.assert_array_equal(await reader.ask(GetWeights()), merged.weights)
        np.testing.assert_allclose(await _steps(reader, 4), await _steps(writer, 4), rtol=1e-5)


async def test_a_missing_shard_is_refused_with_nothing_changed(tmp_path: Path) -> None:
    path = tmp_path / "sharded.ckpt"
    async with ActorSystem("zero-ckpt") as system:
        writer = await _sharded(system, 2, stage=2, shard_checkpoints=True)
        await _steps(writer, 1)
        await writer.ask(SaveCheckpoint(path))
        shard_path(path, 1, 2, generation=1).unlink()
        reader = await _sharded(system, 2, stage=2)
        before = await reader.ask(GetWeights())
        with pytest.raises((CheckpointError, OSError)):
            await reader.ask(LoadCheckpoint(path))
        np.testing.assert_array_equal(await reader.ask(GetWeights()), before)
        with pytest.raises(FileNotFoundError):
            merge_shards(tmp_path / "nothing-here.ckpt")


def _tamper(shard: Path, change: Any) -> None:
    ckpt = load_checkpoint(shard)
    change(ckpt.optimizer)
    save_checkpoint(shard, ckpt)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda opt: (opt.pop("exp_avg"), opt.pop("exp_avg_sq")), "entries differ"),
        (lambda opt: opt["kind"].update(lr=0.5), "'kind' differs"),
        (lambda opt: opt.update(step=4), "'step' differs"),
        (lambda opt: opt.update(exp_avg=1.0), "'exp_avg' differs"),
    ],
)
async def test_shards_whose_optimizer_states_differ_are_refused(
    change: Any, message: str, tmp_path: Path
) -> None:
    """A shard missing a buffer would leave its positions zero in the merge;
    one with other settings would silently take shard 0's."""
    path = tmp_path / "sharded.ckpt"
    async with ActorSystem("zero-ckpt") as system:
        writer = await _sharded(system, 2, stage=2, shard_checkpoints=True)
        await _steps(writer, 1)
        await writer.ask(SaveCheckpoint(path))
        _tamper(shard_path(path, 1, 2, generation=1), change)
        with pytest.raises(CheckpointError, match=message):
            merge_shards(path)
        reader = await _sharded(system, 2, stage=2)
        before = await reader.ask(GetWeights())
        with pytest.raises(CheckpointError, match=message):
            await reader.ask(LoadCheckpoint(path))
        np.testing.assert_array_equal(await reader.ask(GetWeights()), before)


async def test_a_refused_save_of_one_file_per_replica_writes_none(tmp_path: Path) -> None:
    """An index target that cannot be replaced (here a directory) is found
    before any file is written: no replica's file is left beside it."""
    path = tmp_path / "sharded.ckpt"
    path.mkdir()
    async with ActorSystem("zero-ckpt") as system:
        writer = await _sharded(system, 2, stage=2, shard_checkpoints=True)
        with pytest.raises(CheckpointError, match="not a regular file"):
            await writer.ask(SaveCheckpoint(path))
    written = sorted(p.name for p in tmp_path.iterdir() if p.is_file())
    assert written == []


async def test_a_save_cut_off_before_its_index_leaves_the_previous_one_whole(
    tmp_path: Path,
) -> None:
    """A save writes a new generation of files and replaces the index last:
    cut off after its shards (a kill), the index still names the previous
    save's files, untouched; the next save removes the stray generation."""
    path = tmp_path / "sharded.ckpt"
    async with ActorSystem("zero-ckpt") as system:
        writer = await _sharded(system, 2, stage=2, shard_checkpoints=True)
        await _steps(writer, 1)
        await writer.ask(SaveCheckpoint(path))
        saved = merge_shards(path)
        await _steps(writer, 2)
        # what a save killed between its shards and its index leaves behind
        layout = ShardLayout(((0, writer_model().n_params),), 2)
        pieces = [
            ShardReplicaState(layout.take(np.full(layout.n_params, 7.0), k), {}, 10)
            for k in range(2)
        ]
        write_shards(path, layout, pieces, writer_model().config(), next_generation(path), SAVE_ID)
        assert shard_path(path, 0, 2, generation=2).is_file()
        again = merge_shards(path)
        np.testing.assert_array_equal(again.weights, saved.weights)
        assert again.step == saved.step == 5
        # and what a save killed inside a shard's write leaves: its temp file
        (tmp_path / ".sharded.ckpt.gen-2.shard-1-of-2.Ab3_x9Zq.tmp").write_bytes(b"partial")
        await writer.ask(SaveCheckpoint(path))
        np.testing.assert_array_equal(merge_shards(path).weights, await writer.ask(GetWeights()))
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == [
        "sharded.ckpt",
        "sharded.ckpt.gen-3.shard-0-of-2",
        "sharded.ckpt.gen-3.shard-1-of-2",
    ]


async def test_an_index_written_before_generations_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "sharded.ckpt"
    async with ActorSystem("zero-ckpt") as system:
        writer = await _sharded(system, 2, stage=1, shard_checkpoints=True)
        await _steps(writer, 1)
        await writer.ask(SaveCheckpoint(path))
        index = load_checkpoint(path)
        del index.extra["sharded"]["generation"]  # the old index format
        save_checkpoint(path, index)
        for g in range(2):
            shard_path(path, g, 2, generation=1).rename(shard_path(path, g, 2))
        np.testing.assert_array_equal(merge_shards(path).weights, await writer.ask(GetWeights()))
        await writer.ask(SaveCheckpoint(path))  # a new save replaces the old files too
    assert not shard_path(path, 0, 2).exists() and shard_path(path, 0, 2, generation=1).is_file()


@pytest.mark.parametrize("writer", ["single", "tensor parallel", "sharded full format"])
async def test_a_full_save_over_an_index_removes_its_shard_files(
    writer: str, tmp_path: Path
) -> None:
    """The shard files of an index a full save replaced stayed for good."""
    path = tmp_path / "sharded.ckpt"
    async with ActorSystem("zero-ckpt") as system:
        sharded = await _sharded(system, 2, stage=3, shard_checkpoints=True)
        await sharded.ask(SaveCheckpoint(path))
        (tmp_path / ".sharded.ckpt.gen-2.shard-1-of-2.Ab3_x9Zq.tmp").write_bytes(b"partial")
        if writer == "single":
            full = await Trainer.spawn(system, Mlp(SIZES, seed=5), ["cpu:0"], CONFIG)
        elif writer == "tensor parallel":
            full = await TensorParallelTrainer.spawn(
                system, Mlp(SIZES, seed=5), cpu_devices(2), CONFIG
            )
        else:
            full = await _sharded(system, 2, stage=3)
        await _steps(full, 1)
        await full.ask(SaveCheckpoint(path))
        np.testing.assert_array_equal(merge_shards(path).weights, await full.ask(GetWeights()))
    assert [p.name for p in tmp_path.iterdir()] == ["sharded.ckpt"]


def test_a_full_save_that_fails_leaves_the_index_and_its_shards(tmp_path: Path) -> None:
    """The shard files go only once the new file is in place."""
    path = tmp_path / "s.ckpt"
    weights = writer_model().get_params()
    _save_in_shards(path, weights)
    before = sorted(tmp_path.iterdir())
    bad = Checkpoint(writer_model().config(), weights, 3, {}, {"x": np.array([None], object)})
    with pytest.raises(CheckpointError):
        save_checkpoint(path, bad)
    assert sorted(tmp_path.iterdir()) == before
    np.testing.assert_array_equal(merge_shards(path).weights, weights)


@pytest.mark.parametrize(
    "info",
    [
        {"count": 2, "n_params": 10**15, "generation": 1},
        {"count": 2, "n_params": -1, "generation": 1},
        {"count": 0, "n_params": 5},
        {"count": "many", "n_params": 5},
        {"count": 2, "n_params": 5, "generation": -2},
        "text",
    ],
)
async def test_a_hostile_index_is_a_checkpoint_error(info: Any, tmp_path: Path) -> None:
    path = tmp_path / "sharded.ckpt"
    async with ActorSystem("zero-ckpt") as system:
        writer = await _sharded(system, 2, stage=1, shard_checkpoints=True)
        await writer.ask(SaveCheckpoint(path))
    index = load_checkpoint(path)
    index.extra["sharded"] = info
    save_checkpoint(path, index)
    with pytest.raises(CheckpointError, match="shard"):
        merge_shards(path)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"count": 2.9}, "count must be an int, got 2.9"),
        ({"count": "2"}, "count must be an int, got '2'"),
        ({"count": True}, "count must be an int, got True"),
        ({"generation": 1.0}, "generation must be an int, got 1.0"),
        ({"generation": -1}, "generation must be >= 0, got -1"),
        ({"n_params": 2**70}, f"n_params must be <= {INDEX_MAX}, got {2**70}"),
    ],
)
async def test_an_index_field_that_is_no_json_int_is_a_checkpoint_error(
    change: dict[str, Any], says: str, tmp_path: Path
) -> None:
    """`int()` took a count of 2.9 or "2" as 2 shards (the save loaded as if
    whole), True as 1 (a FileNotFoundError for a shard never written). Each
    field is a count by the one rule of sizes, and the message names it."""
    path = tmp_path / "sharded.ckpt"
    async with ActorSystem("zero-ckpt") as system:
        writer = await _sharded(system, 2, stage=1, shard_checkpoints=True)
        await writer.ask(SaveCheckpoint(path))
    index = load_checkpoint(path)
    index.extra["sharded"] = {**index.extra["sharded"], **change}
    save_checkpoint(path, index)
    with pytest.raises(CheckpointError, match=f"a bad shard index: {re.escape(says)}$"):
        merge_shards(path)


def _save_in_shards(path: Path, weights: np.ndarray) -> None:
    """A save of step 3, one file per replica of two, generation 1."""
    config = writer_model().config()
    layout = ShardLayout(((0, weights.size),), replicas=2)
    write_shards(path, layout, split_state(layout, weights, {}, 3), config, 1, SAVE_ID)
    write_index(path, layout, 3, config, {}, 1, SAVE_ID)


def _digest(path: Path) -> str:
    return save_digest(path, load_checkpoint(path))


def test_a_saves_digest_tells_byte_equal_indexes_of_other_shard_files_apart(
    tmp_path: Path,
) -> None:
    """Two hosts, say, each holding a save of the same step and generation:
    the indexes are byte-equal, the weights are not (the digest of the index
    alone took them for one save)."""
    weights = writer_model().get_params()
    here, there, copy = tmp_path / "here", tmp_path / "there", tmp_path / "copy"
    for folder in (here, there):
        folder.mkdir()
    _save_in_shards(here / "s.ckpt", weights)
    _save_in_shards(there / "s.ckpt", weights + np.float32(0.5))
    assert (here / "s.ckpt").read_bytes() == (there / "s.ckpt").read_bytes()
    assert _digest(here / "s.ckpt") != _digest(there / "s.ckpt")
    shutil.copytree(here, copy)
    assert _digest(copy / "s.ckpt") == _digest(here / "s.ckpt")
    shard_path(copy / "s.ckpt", 1, 2, generation=1).unlink()
    with pytest.raises(FileNotFoundError):
        _digest(copy / "s.ckpt")
    full = tmp_path / "full.ckpt"
    save_checkpoint(full, merge_shards(here / "s.ckpt"))
    assert _digest(full) == checkpoint_digest(full)
