"""Fuzzed checkpoint files: a valid save of every strategy (float32 and
float64), damaged at random.

A damaged file (truncated, a bit flipped, its checksum left as it was) must
be a `CheckpointError`. A hostile one (its checksum recomputed around a
mutated header, array member or archive) may load, when what it says is
still a valid checkpoint; loaded, the trainer must hold exactly what it
says, and refused (`CheckpointError`, or `OSError` for a file that is not
there), the trainer's weights, step and optimizer state must be unchanged.
Nothing may allocate from a declared size, and nothing may hang.

The mutations are in `checkpoint_mutations.py`; `ATOMR_FUZZ_EXAMPLES`
raises the example count when hunting (CI: a few).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import threading
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from atomr import ActorRef, ActorSystem
from atomr.accel import cpu_devices
from atomr.train import (
    AsyncParameterServer,
    CheckpointError,
    GetWeights,
    LoadCheckpoint,
    Mlp,
    OptimizerKind,
    ParameterServerOptions,
    SaveCheckpoint,
    ShardedDataParallelTrainer,
    ShardedOptions,
    Step,
    TrainerConfig,
    load_checkpoint,
)
from atomr.train.core import Checkpoint, save_checkpoint, synthetic_classification
from atomr.train.core.checkpoint import checkpoint_digest
from atomr.train.core.model import Activation, Linear, Sequential, gpt
from atomr.train.core.sharded_index import merge_shards, save_digest
from atomr.train.parameter_server import Consistency
from tests.reliability.checkpoint_mutations import (
    SPECIAL,
    Saved,
    _fuzz,
    _join,
    _npy_text,
    _sealed,
    _split,
    _write,
    damaged_save,
)
from tests.train.test_contract import CONFIG, STRATEGIES

WINDOW = dataclasses.replace(CONFIG, accumulation_steps=2)  # saved inside an open window
SGD = dataclasses.replace(CONFIG, optimizer=OptimizerKind.sgd(0.1, momentum=0.9))
ALL: dict[str, tuple[Any, Any, int, TrainerConfig]] = {
    **{name: (*spawn, CONFIG) for name, spawn in STRATEGIES.items()},
    "zero-files": (
        ShardedDataParallelTrainer,
        ShardedOptions(stage=1, shard_checkpoints=True),
        2,
        CONFIG,
    ),
    "zero-2": (ShardedDataParallelTrainer, ShardedOptions(stage=2), 2, CONFIG),
    "single-window": (*STRATEGIES["single"], WINDOW),
    "data-window": (*STRATEGIES["data"], WINDOW),
    "data-sgd": (*STRATEGIES["data"], SGD),
    "ps-shards": (
        AsyncParameterServer,
        ParameterServerOptions(workers=2, shards=2, consistency=Consistency.synchronous()),
        2,
        dataclasses.replace(CONFIG, gradient_clip=None),  # several shards: no global norm
    ),
    "tensor-layers": (*STRATEGIES["tensor"], CONFIG),  # a Sequential: LayerTensorParallelTrainer
    "pipeline-layers": (*STRATEGIES["pipeline"], CONFIG),
    "tensor-gpt": (*STRATEGIES["tensor"], CONFIG),
    "pipeline-gpt": (*STRATEGIES["pipeline"], CONFIG),
}
"""The `-layers` and `-gpt` strategies train a `Sequential` (another
config, and for tensor parallelism another trainer:
`LayerTensorParallelTrainer`), the others an `Mlp`."""
VOCAB, CONTEXT = 5, 3


def _model(strategy: str, seed: int, dtype: Any) -> Any:
    """The model `strategy` trains: an `Mlp`, the same function as a
    `Sequential` (`-layers`), or a GPT of token ids (`-gpt`)."""
    if strategy.endswith("-gpt"):
        return gpt(VOCAB, CONTEXT, n_layer=1, d_model=4, n_head=2, seed=seed, dtype=dtype)
    if strategy.endswith("-layers"):
        layers = [Linear(4, 5), Activation("tanh"), Linear(5, 3)]
        return Sequential(layers, (4,), seed=seed, dtype=dtype)
    return Mlp([4, 5, 3], seed=seed, dtype=dtype)


def _batch(strategy: str) -> tuple[np.ndarray, np.ndarray]:
    """A batch of `strategy`'s model: 16 samples of features, or of token ids
    and their next tokens."""
    if strategy.endswith("-gpt"):
        text = np.random.default_rng(3).integers(0, VOCAB, size=(16, CONTEXT + 1))
        return text[:, :-1].copy(), text[:, 1:].copy()
    return synthetic_classification(16, 4, 3, seed=3)


DTYPES = {"f32": np.float32, "f64": np.float64}
PEAK = 8 * 2**20  # far below any size a mutation declares or inflates to


async def _save(system: ActorSystem, strategy: str, dtype: Any, folder: Path) -> Saved:
    trainer_class, options, n, config = ALL[strategy]
    model = _model(strategy, 1, dtype)
    ref = await trainer_class.spawn(system, model, cpu_devices(n), config, options)
    await ref.ask(Step(*_batch(strategy)), timeout=30)
    folder.mkdir()
    await ref.ask(SaveCheckpoint(folder / "c.ckpt"), timeout=30)
    await ref.stop()
    names = sorted(p.name for p in folder.iterdir())
    names.remove("c.ckpt")
    files = {name: (folder / name).read_bytes() for name in ["c.ckpt", *names]}
    return Saved(files, merge_shards(folder / "c.ckpt"))


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Saved]:
    """A valid save of every strategy in every dtype."""
    root = tmp_path_factory.mktemp("saves")

    async def run() -> dict[tuple[str, str], Saved]:
        async with ActorSystem("fuzz-saves") as system:
            return {
                (s, d): await _save(system, s, dtype, root / f"{s}-{d}")
                for s in ALL
                for d, dtype in DTYPES.items()
            }

    return asyncio.run(run())


def _same(a: Checkpoint, b: Checkpoint) -> bool:
    """The same state, bit for bit (dtypes included)."""

    def same_state(x: dict[str, Any], y: dict[str, Any]) -> bool:
        if x.keys() != y.keys():
            return False
        for key, value in x.items():
            other = y[key]
            if isinstance(value, np.ndarray) or isinstance(other, np.ndarray):
                if _bits(value) != _bits(other):
                    return False
            elif json.dumps(value, sort_keys=True) != json.dumps(other, sort_keys=True):
                return False
        return True

    return (
        a.model == b.model
        and a.step == b.step
        and _bits(a.weights) == _bits(b.weights)
        and same_state(a.optimizer, b.optimizer)
        and same_state(a.extra, b.extra)
    )


def _bits(value: Any) -> tuple[str, tuple[int, ...], bytes] | None:
    if not isinstance(value, np.ndarray):
        return None
    return value.dtype.str, value.shape, value.tobytes()


def _merge_bounded(path: Path) -> Checkpoint | BaseException:
    """`merge_shards(path)` (what every trainer reads), or the error it
    raised; its peak memory checked."""
    tracemalloc.start()
    try:
        return merge_shards(path)
    except (CheckpointError, OSError) as exc:
        return exc
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak < PEAK, f"loading {path} took {peak} bytes"


def test_a_damaged_or_hostile_file_is_refused_or_loads_what_it_says(
    saved: dict[tuple[str, str], Saved], tmp_path: Path
) -> None:
    keys = sorted(saved)
    others = [s.files["c.ckpt"] for s in saved.values()]

    @_fuzz(60)
    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        save = saved[data.draw(st.sampled_from(keys))]
        name, how, damaged = data.draw(damaged_save(save, others))
        outcome = _merge_bounded(_write(tmp_path, save, name, damaged, how))
        if how == "raw":  # the checksum refuses it
            assert isinstance(outcome, CheckpointError), outcome
        elif how in SPECIAL and how != "good link":
            assert isinstance(outcome, CheckpointError | OSError), outcome
        elif isinstance(outcome, Checkpoint) and damaged == save.files[name]:
            assert _same(outcome, save.ckpt)
        else:
            assert isinstance(outcome, Checkpoint | CheckpointError | OSError), outcome

    check()


# ------------------------------------------------------------- into a trainer


async def _state(ref: ActorRef, folder: Path) -> Checkpoint:
    """The trainer's whole state, as its own save gives it."""
    await ref.ask(SaveCheckpoint(folder / "now.ckpt"), timeout=30)
    return merge_shards(folder / "now.ckpt")


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("strategy", list(ALL))
def test_a_trainer_loads_what_a_hostile_file_says_or_refuses_it_unchanged(
    strategy: str, dtype: str, saved: dict[tuple[str, str], Saved], tmp_path: Path
) -> None:
    save = saved[strategy, dtype]
    others = [s.files["c.ckpt"] for s in saved.values()]
    good, files, own = tmp_path / "good", tmp_path / "files", tmp_path / "own"
    for folder in (good, files, own):
        folder.mkdir()
    good_path = _write(good, save, "c.ckpt", save.files["c.ckpt"])
    trainer_class, options, n, config = ALL[strategy]
    with asyncio.Runner() as runner:
        system = ActorSystem("fuzz-load")
        runner.run(system.__aenter__())
        try:
            model = _model(strategy, 2, DTYPES[dtype])
            ref = runner.run(trainer_class.spawn(system, model, cpu_devices(n), config, options))
            runner.run(ref.ask(LoadCheckpoint(good_path), timeout=30))
            baseline = runner.run(_state(ref, own))
            weights = runner.run(ref.ask(GetWeights(), timeout=30))

            @_fuzz(6)
            @given(data=st.data())
            def check(data: st.DataObject) -> None:
                name, how, damaged = data.draw(damaged_save(save, others))
                path = _write(files, save, name, damaged, how)
                expected = _merge_bounded(path)
                try:
                    runner.run(ref.ask(LoadCheckpoint(path), timeout=30))
                except (CheckpointError, OSError) as exc:
                    now = runner.run(ref.ask(GetWeights(), timeout=30))
                    assert _bits(now) == _bits(weights), f"weights changed by a refused load: {exc}"
                    assert _same(runner.run(_state(ref, own)), baseline), exc
                    return
                assert isinstance(expected, Checkpoint), f"the trainer loaded {expected!r}"
                now = runner.run(ref.ask(GetWeights(), timeout=30))
                assert _bits(now) == _bits(expected.weights.astype(now.dtype))
                assert runner.run(_state(ref, own)).step == expected.step
                runner.run(ref.ask(LoadCheckpoint(good_path), timeout=30))

            check()
        finally:
            runner.run(system.__aexit__(None, None, None))


# ------------------------------------------------------------- what the fuzz found


def _with_directory_field(folder: Path, at: int, value: int) -> Path:
    """A valid checkpoint whose first zip directory entry has the 2 bytes at
    offset `at` set to `value`, its checksum recomputed."""
    path = folder / "c.ckpt"
    save_checkpoint(path, Checkpoint({}, np.zeros(3, np.float32), 1))
    raw = path.read_bytes()
    i = raw.index(b"PK\x01\x02") + at
    path.write_bytes(_sealed(raw[:i] + value.to_bytes(2, "little") + raw[i + 2 : -32]))
    return path


@pytest.mark.parametrize(
    ("at", "value", "error"),
    [
        (6, 109, "not a zip archive: zip file version 10.9"),  # NotImplementedError before
        (8, 0x01, "'weights.npy' is encrypted"),  # RuntimeError before
        (8, 0x20, "'weights.npy' is encrypted"),  # NotImplementedError before (patched data)
        (8, 0x40, "'weights.npy' is encrypted"),  # NotImplementedError before (strong)
    ],
)
def test_a_payload_of_a_zip_feature_the_reader_lacks_is_a_checkpoint_error(
    tmp_path: Path, at: int, value: int, error: str
) -> None:
    with pytest.raises(CheckpointError, match=error):
        load_checkpoint(_with_directory_field(tmp_path, at, value))


@pytest.mark.parametrize(
    "header",
    [
        "{'descr': '<f4', 'fortran_order': False, 'shape': (3,}",  # TokenError before
        "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), '''",  # TokenError before
    ],
)
def test_an_array_header_numpy_cannot_tokenize_is_a_checkpoint_error(
    tmp_path: Path, header: str
) -> None:
    path = tmp_path / "c.ckpt"
    save_checkpoint(path, Checkpoint({}, np.zeros(3, np.float32), 1))
    parts = _split(path.read_bytes())
    parts.members = [("weights.npy", _npy_text(header, bytes(12)))]
    path.write_bytes(_join(parts))
    with pytest.raises(CheckpointError, match="payload member 'weights.npy' is malformed"):
        load_checkpoint(path)


def test_a_header_nested_deeper_than_32_levels_is_refused_naming_the_field(
    tmp_path: Path,
) -> None:
    """The CLI's comparison of such a schedule with its own was a RecursionError."""
    path = tmp_path / "c.ckpt"
    deep: dict[str, Any] = {"kind": "cosine"}
    for _ in range(32):
        deep = {"kind": "sequential", "schedules": [deep]}
    save_checkpoint(path, Checkpoint({}, np.zeros(3, np.float32), 1, {"kind": {"schedule": deep}}))
    with pytest.raises(CheckpointError, match=r"header\.optimizer\.kind\.schedule\.sch.*32 levels"):
        load_checkpoint(path)


def _digest_in_thread(read: Any) -> BaseException | str:
    """`read()` on a daemon thread: what it returned or raised; fails the
    test if it is still blocked after 30 s."""
    outcome: list[BaseException | str] = []

    def run() -> None:
        try:
            outcome.append(read())
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=30)
    return outcome[0] if outcome else TimeoutError("blocked")


def test_the_digest_of_a_fifo_index_or_shard_is_refused_without_blocking(
    saved: dict[tuple[str, str], Saved], tmp_path: Path
) -> None:
    """`atomr train --resume` of a sharded save read its shard files' digests
    (`save_digest`) before their content, with a blocking open: a FIFO in a
    shard's place hung it."""
    save = saved["zero-files", "f32"]
    shard = [name for name in save.files if "shard" in name][0]
    path = _write(tmp_path, save, shard, b"", "fifo")
    try:
        index = load_checkpoint(path)
        outcome = _digest_in_thread(lambda: save_digest(path, index))
        assert isinstance(outcome, CheckpointError), outcome
        assert "not a regular file" in str(outcome) and shard in str(outcome)
        _write(tmp_path, save, "c.ckpt", b"", "fifo")
        outcome = _digest_in_thread(lambda: checkpoint_digest(path))
        assert isinstance(outcome, CheckpointError), outcome
    finally:  # a reader still blocked in open() is let go
        for fifo in tmp_path.iterdir():
            if fifo.is_fifo():
                with contextlib.suppress(OSError):
                    os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
