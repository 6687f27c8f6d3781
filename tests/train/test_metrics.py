"""Metrics logs of `fit`: JSON Lines, and TensorBoard event files read back
with tensorboardX's own protobuf definitions."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import numpy as np
import pytest

from atomr import ActorSystem
from atomr.accel import cpu_devices
from atomr.train import (
    DataParallelOptions,
    DataParallelTrainer,
    LossKind,
    Mlp,
    OptimizerKind,
    Trainer,
    TrainerConfig,
    fit,
)
from atomr.train.core import synthetic_classification
from atomr.train.core.stats import StepStats
from atomr.train.fit import EpochRecord, FitPosition
from atomr.train.metrics import JsonLinesLog, TensorBoardLog

CONFIG = TrainerConfig(OptimizerKind.adam(0.01), LossKind.CROSS_ENTROPY)
X, Y = synthetic_classification(64, 6, 3, seed=1)


async def _fit(trainer_class, devices, options, callbacks, config=CONFIG) -> None:  # type: ignore[no-untyped-def]
    async with ActorSystem("metrics") as system:
        model = Mlp([6, 8, 3], seed=0)
        ref = await trainer_class.spawn(system, model, devices, config, options)
        await fit(ref, (X, Y), validation=(X[:16], Y[:16]), epochs=2, batch_size=16,
                  callbacks=callbacks)  # fmt: skip


@pytest.mark.parametrize("strategy", ["single", "data"])
async def test_the_json_lines_log_holds_every_step_evaluation_and_epoch(
    strategy: str, tmp_path: Path
) -> None:
    path = tmp_path / "deep" / "metrics.jsonl"
    with JsonLinesLog(path) as log:
        if strategy == "single":
            await _fit(Trainer, "cpu:0", None, [log])
        else:
            await _fit(DataParallelTrainer, cpu_devices(2), DataParallelOptions(), [log])
    events = [json.loads(line) for line in path.read_text().splitlines()]
    steps = [e for e in events if e["event"] == "step"]
    assert [e["step"] for e in steps] == list(range(1, 9))
    assert all(e["samples"] == 16 and e["samples_per_s"] > 0 for e in steps)
    shares = [e["allreduce_share"] for e in steps]
    if strategy == "single":
        assert shares == [0.0] * 8
    else:
        assert all(0.0 < s < 1.0 for s in shares)  # the all-reduce is part of the step
    evaluations = [(e["split"], e["step"], e["epoch"]) for e in events if e["event"] == "evaluate"]
    assert evaluations == [
        ("train", 4, 1),
        ("validation", 4, 1),
        ("train", 8, 2),
        ("validation", 8, 2),
    ]  # numbered as the epoch events are
    epochs = [e for e in events if e["event"] == "epoch"]
    assert [e["epoch"] for e in epochs] == [1, 2] and epochs[1]["test_accuracy"] is not None


def test_the_json_lines_log_writes_nan_and_infinity_as_null(tmp_path: Path) -> None:
    """Step events held bare NaN and Infinity, which no strict JSON reader takes."""
    path = tmp_path / "m.jsonl"
    with JsonLinesLog(path) as log:
        log.on_step(FitPosition(0, 1, 1), StepStats(math.nan, math.inf, 10, 4), 0.0, -math.inf)
        log.on_evaluate("train", math.nan, math.inf, FitPosition(0, 1, 1))
        log.on_epoch_end(EpochRecord(1, 1, math.nan, math.inf, 1.0, 1.0, 1.0, 1.0), 1)

    def strict(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    step, evaluate, epoch = (json.loads(line, parse_constant=strict)
                             for line in path.read_text().splitlines())  # fmt: skip
    assert (step["loss"], step["grad_norm"], step["samples_per_s"]) == (None, None, None)
    assert (evaluate["loss"], evaluate["accuracy"]) == (None, None)
    assert (epoch["train_loss"], epoch["train_accuracy"], epoch["test_loss"]) == (None, None, 1.0)


def test_the_json_lines_log_takes_numpy_scalars_from_a_trainer_of_ones_own(
    tmp_path: Path,
) -> None:
    """A trainer of one's own may answer `StepStats` of NumPy scalars: the
    step failed with 'Object of type float32 is not JSON serializable' (and
    an np.float32 NaN would not have been nulled)."""
    path = tmp_path / "m.jsonl"
    stats = StepStats(
        np.float32(0.5), np.float32(np.nan), np.int64(10), np.int64(4), np.bool_(True)
    )
    with JsonLinesLog(path) as log:
        log.on_step(FitPosition(0, 1, 1), stats, 0.5, 2.0)  # type: ignore[arg-type]
    step = json.loads(path.read_text())
    assert (step["loss"], step["grad_norm"], step["samples"], step["applied"]) == (
        0.5,
        None,
        4.0,
        True,
    )


def _read_events(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of the event files, by tag: TFRecord framing, decoded with
    tensorboardX's own `Event` message."""
    event_pb2 = pytest.importorskip(
        "tensorboardX.proto.event_pb2", reason="tensorboardX (atomr[tensorboard]) not installed"
    )
    scalars: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(logdir.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        pos = 0
        while pos < len(data):
            (length,) = struct.unpack("<Q", data[pos : pos + 8])
            event = event_pb2.Event.FromString(data[pos + 12 : pos + 12 + length])
            pos += 12 + length + 4
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


async def test_tensorboard_event_files_hold_the_curves(tmp_path: Path) -> None:
    pytest.importorskip("tensorboardX", reason="tensorboardX (atomr[tensorboard]) not installed")
    jsonl = tmp_path / "m.jsonl"
    with TensorBoardLog(tmp_path / "tb") as board, JsonLinesLog(jsonl) as log:
        await _fit(Trainer, "cpu:0", None, [board, log])
    scalars = _read_events(tmp_path / "tb")
    losses = [e["loss"] for e in map(json.loads, jsonl.read_text().splitlines())
              if e["event"] == "step"]  # fmt: skip
    assert [s for s, _ in scalars["step/loss"]] == list(range(1, 9))
    np.testing.assert_allclose([v for _, v in scalars["step/loss"]], losses, rtol=1e-6)
    assert [s for s, _ in scalars["validation/accuracy"]] == [4, 8]
    assert [s for s, _ in scalars["epoch/train_loss"]] == [4, 8]


async def test_tensorboard_has_one_point_per_optimizer_step_under_accumulation(
    tmp_path: Path,
) -> None:
    pytest.importorskip("tensorboardX", reason="tensorboardX (atomr[tensorboard]) not installed")
    jsonl = tmp_path / "m.jsonl"
    config = TrainerConfig(OptimizerKind.adam(0.01), LossKind.CROSS_ENTROPY, accumulation_steps=2)
    with TensorBoardLog(tmp_path / "tb") as board, JsonLinesLog(jsonl) as log:
        await _fit(Trainer, "cpu:0", None, [board, log], config)
    steps = [e for e in map(json.loads, jsonl.read_text().splitlines()) if e["event"] == "step"]
    assert [e["applied"] for e in steps] == [False, True] * 4  # 8 batches, 4 updates
    applied = [e for e in steps if e["applied"]]
    scalars = _read_events(tmp_path / "tb")
    for tag in ("step/loss", "step/grad_norm"):
        assert [s for s, _ in scalars[tag]] == [1, 2, 3, 4]
    np.testing.assert_allclose([v for _, v in scalars["step/grad_norm"]],
                               [e["grad_norm"] for e in applied], rtol=1e-6)  # fmt: skip
    assert all(v > 0 for _, v in scalars["step/grad_norm"])


def test_tensorboard_without_the_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    with pytest.raises(ImportError, match=r"pip install -e '\.\[tensorboard\]'"):
        TensorBoardLog("unused")
