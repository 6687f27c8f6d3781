"""`fit` over a user's data: a map-style dataset (with `__getitem__` or
`get_batch`) and an iterable of batches train exactly as arrays do with the
same seed; `drop_last`; bad datasets are clear errors; a data source that
raises mid-epoch keeps the checkpointed position."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atomr import ActorRef, ActorSystem
from atomr.train import (
    GetWeights,
    LoadCheckpoint,
    LossKind,
    Mlp,
    OptimizerKind,
    Trainer,
    TrainerConfig,
)
from atomr.train.core import synthetic_classification
from atomr.train.core.sources import InvalidDataError
from atomr.train.fit import (
    DataSourceError,
    FitCallback,
    FitPosition,
    StopFlag,
    batch_bounds,
    epoch_order,
    fit,
)

CONFIG = TrainerConfig(OptimizerKind.adam(0.01), LossKind.CROSS_ENTROPY)
X, Y = synthetic_classification(90, 6, 3, seed=1)
XV, YV = synthetic_classification(30, 6, 3, seed=2)


class Samples:
    """A map-style dataset of single samples."""

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.int64]:
        return self.x[i], self.y[i]


class Batches:
    """A map-style dataset with a batch getter (no per-sample calls)."""

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def get_batch(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.x[idx], self.y[idx]


def same_batches_as_arrays(epoch: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """What the array loop feeds, as a user's own generator would."""
    order = epoch_order(len(Y), 3, epoch)
    for lo in range(0, len(Y), 16):
        idx = order[lo : lo + 16]
        yield X[idx], Y[idx]


async def _train(system: ActorSystem, data: Any, **kwargs: Any) -> tuple[np.ndarray, Any]:
    ref = await Trainer.spawn(system, Mlp([6, 8, 3], seed=0), "cpu:0", CONFIG)
    result = await fit(ref, data, epochs=2, batch_size=16, seed=3, **kwargs)
    weights = await ref.ask(GetWeights())
    await ref.stop()
    return weights, result


async def test_datasets_and_iterables_train_exactly_as_arrays_do() -> None:
    async with ActorSystem("sources") as system:
        expected, reference = await _train(system, (X, Y), validation=(XV, YV))
        for data in (Samples(X, Y), Batches(X, Y), same_batches_as_arrays):
            weights, result = await _train(system, data, validation=Batches(XV, YV))
            np.testing.assert_array_equal(weights, expected)
            assert [r.step for r in result.epochs] == [r.step for r in reference.epochs]
            np.testing.assert_allclose(
                [r.test_accuracy for r in result.epochs],
                [r.test_accuracy for r in reference.epochs],
            )
            np.testing.assert_allclose(
                [r.train_loss for r in result.epochs],
                [r.train_loss for r in reference.epochs],
                rtol=1e-6,
            )


async def test_drop_last_drops_the_short_tail() -> None:
    async with ActorSystem("sources") as system:
        _, kept = await _train(system, (X, Y))
        _, dropped = await _train(system, Samples(X, Y), drop_last=True)
    assert [r.step for r in kept.epochs] == [6, 12]  # 90 = 5 x 16 + 10
    assert [r.step for r in dropped.epochs] == [5, 10]


@pytest.mark.parametrize(
    "data", [[(X[:16], Y[:16]), (X[16:20], Y[16:20])], same_batches_as_arrays],
    ids=["list", "callable"],
)  # fmt: skip
async def test_drop_last_for_batches_taken_as_they_come_is_refused(data: Any) -> None:
    async with ActorSystem("sources") as system:
        ref = await Trainer.spawn(system, Mlp([6, 8, 3], seed=0), "cpu:0", CONFIG)
        before = await ref.ask(GetWeights())
        with pytest.raises(ValueError, match="drop_last applies to arrays and datasets"):
            await fit(ref, data, epochs=1, batch_size=16, drop_last=True)
        np.testing.assert_array_equal(await ref.ask(GetWeights()), before)


@pytest.mark.parametrize("drop_last", ["no", 1, None, 0.0])
@pytest.mark.parametrize("data", ["arrays", "list"])
async def test_drop_last_that_is_not_a_bool_is_refused(data: str, drop_last: Any) -> None:
    """drop_last='no' is truthy: the arrays' short tail was dropped, and a
    list of batches was refused for asking what it did not ask."""
    train = (X, Y) if data == "arrays" else [(X[:16], Y[:16]), (X[16:20], Y[16:20])]
    async with ActorSystem("sources") as system:
        ref = await Trainer.spawn(system, Mlp([6, 8, 3], seed=0), "cpu:0", CONFIG)
        before = await ref.ask(GetWeights())
        with pytest.raises(TypeError, match="drop_last must be True or False"):
            await fit(ref, train, epochs=1, batch_size=16, drop_last=drop_last)
        np.testing.assert_array_equal(await ref.ask(GetWeights()), before)
    with pytest.raises(TypeError, match="drop_last must be True or False"):
        batch_bounds(90, 16, drop_last=drop_last)
    assert batch_bounds(90, 16, drop_last=np.bool_(True))[-1] == (64, 80)  # numpy's bool is one


class _Short(Samples):
    def __len__(self) -> int:
        return len(self.y) + 5  # claims more samples than it has


class _Ragged(Samples):
    def __getitem__(self, i: int) -> tuple[np.ndarray, np.int64]:
        x, y = super().__getitem__(i)
        return (x[:3] if i == 7 else x), y


class _RaggedEnd(Samples):
    def __getitem__(self, i: int) -> tuple[np.ndarray, np.int64]:
        x, y = super().__getitem__(i)
        return (x[:3] if i == len(self.y) - 1 else x), y


class _Keyed:
    """Samples in a dict by row number, claiming more than it holds (a
    mapping raises KeyError, not IndexError)."""

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.rows = {i: (x[i], y[i]) for i in range(len(y))}

    def __len__(self) -> int:
        return len(self.rows) + 5

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.int64]:
        return self.rows[i]


class _KeyedBatches(Batches):
    def __len__(self) -> int:
        return len(self.y) + 5

    def get_batch(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rows = dict(enumerate(zip(self.x, self.y, strict=True)))
        x, y = zip(*(rows[int(i)] for i in idx), strict=True)
        return np.stack(x), np.array(y)


class _SkipsARecord(Batches):
    def get_batch(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        kept = idx[:-1] if len(idx) > 2 else idx  # a reader that skips an unreadable record
        return self.x[kept], self.y[kept]


class _FixedBlock(Batches):
    def get_batch(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.x[:32], self.y[:32]


class _ShortLabels(Batches):
    def get_batch(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.x[idx], self.y[idx][:1]


@pytest.mark.parametrize(
    "data, error, needle",
    [
        (_Short(X, Y), ValueError, "out of range although len(dataset) is 95"),
        (_Keyed(X, Y), InvalidDataError, "sample 94 is out of range although len(dataset) is 95"),
        (_KeyedBatches(X, Y), InvalidDataError, "samples up to 94 failed although len(dataset)"),
        (_SkipsARecord(X, Y), InvalidDataError, "get_batch returned 15 features for 16 indices"),
        (_FixedBlock(X, Y), InvalidDataError, "get_batch returned 32 features for 2 indices"),
        (_ShortLabels(X, Y), InvalidDataError, "get_batch returned 1 labels for 2 indices"),
        (_RaggedEnd(X, Y), ValueError, "differ in shape"),
        ([(X[:4], Y[:3])], ValueError, "4 features and 3 labels"),
        (iter([(X, Y)]), TypeError, "read only once"),
        (42, TypeError, "must be (features, labels) arrays, a dataset"),
    ],
    ids=[
        "length",
        "keyed",
        "keyed-batch",
        "skips",
        "block",
        "labels",
        "last-shape",
        "pair",
        "generator",
        "number",
    ],
)
async def test_bad_data_is_a_clear_error_and_trains_nothing(
    data: Any, error: type, needle: str
) -> None:
    async with ActorSystem("sources") as system:
        ref = await Trainer.spawn(system, Mlp([6, 8, 3], seed=0), "cpu:0", CONFIG)
        before = await ref.ask(GetWeights())
        with pytest.raises(error, match=needle.replace("(", r"\(").replace(")", r"\)")):
            await fit(ref, data, epochs=1, batch_size=16)
        after = await ref.ask(GetWeights())
    np.testing.assert_array_equal(after, before)


async def test_a_bad_sample_found_mid_epoch_is_named_and_the_position_saved(
    tmp_path: Path,
) -> None:
    saved = _Saved()
    async with ActorSystem("sources") as system:
        ref = await Trainer.spawn(system, Mlp([6, 8, 3], seed=0), "cpu:0", CONFIG)
        with pytest.raises(ValueError, match="differ in shape"):
            await fit(ref, _Ragged(X, Y), epochs=1, batch_size=16, checkpoint=tmp_path / "c",
                      callbacks=[saved])  # fmt: skip
    position = saved.positions[-1]
    assert (position.epoch, position.step) == (0, position.batch)  # the steps before it


class _SkipsInTheThirdBatch(Batches):
    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        super().__init__(x, y)
        self.calls = 0

    def get_batch(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self.calls += 1  # the probe, then the first epoch's batches 0, 1, 2
        return super().get_batch(idx[1:] if self.calls == 4 else idx)


async def test_a_short_get_batch_mid_epoch_trains_nothing_of_it(tmp_path: Path) -> None:
    saved = _Saved()
    async with ActorSystem("sources") as system:
        ref = await Trainer.spawn(system, Mlp([6, 8, 3], seed=0), "cpu:0", CONFIG)
        with pytest.raises(InvalidDataError, match="15 features for 16 indices") as caught:
            await fit(ref, _SkipsInTheThirdBatch(X, Y), epochs=1, batch_size=16,
                      checkpoint=tmp_path / "c", callbacks=[saved])  # fmt: skip
    assert saved.positions[-1] == FitPosition(epoch=0, batch=2, step=2)
    assert "fetching batch 2 of epoch 0" in "".join(caught.value.__notes__)


async def test_a_batch_of_another_shape_is_named_when_reached() -> None:
    async with ActorSystem("sources") as system:
        ref = await Trainer.spawn(system, Mlp([6, 8, 3], seed=0), "cpu:0", CONFIG)
        with pytest.raises(ValueError, match=r"batch 1 has samples of shape \(\(5,\), \(\)\)"):
            await fit(ref, [(X[:4], Y[:4]), (X[:4, :5], Y[:4])], epochs=1, batch_size=4)


class _Saved(FitCallback):
    def __init__(self) -> None:
        self.positions: list[FitPosition] = []

    def on_checkpoint(self, path: Path, position: FitPosition) -> None:
        self.positions.append(position)


async def test_a_source_that_raises_mid_epoch_keeps_the_checkpointed_position(
    tmp_path: Path,
) -> None:
    def flaky(epoch: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for k, batch in enumerate(same_batches_as_arrays(epoch)):
            if epoch == 1 and k == 2:
                raise OSError("the network share went away")
            yield batch

    ckpt = tmp_path / "run.ckpt"
    saved = _Saved()
    async with ActorSystem("sources") as system:
        expected, _ = await _train(system, same_batches_as_arrays)
        ref: ActorRef = await Trainer.spawn(system, Mlp([6, 8, 3], seed=0), "cpu:0", CONFIG)
        with pytest.raises(DataSourceError, match="epoch 2, batch 2.*network share"):
            await fit(ref, flaky, epochs=2, batch_size=16, checkpoint=ckpt, callbacks=[saved])
        assert saved.positions[-1] == FitPosition(epoch=1, batch=2, step=8)
        # resume from the saved position with data that works: the same weights
        resumed = await Trainer.spawn(system, Mlp([6, 8, 3], seed=5), "cpu:0", CONFIG)
        await resumed.ask(LoadCheckpoint(ckpt))
        await fit(resumed, same_batches_as_arrays, epochs=2, batch_size=16,
                  start=saved.positions[-1])  # fmt: skip
        np.testing.assert_array_equal(await resumed.ask(GetWeights()), expected)


async def test_a_list_of_two_batches_of_python_lists_is_two_batches() -> None:
    # was taken for one (features, labels) pair: numpy's "inhomogeneous shape"
    first, second = (X[:16], Y[:16]), (X[16:32], Y[16:32])
    as_lists = [(x.tolist(), y.tolist()) for x, y in (first, second)]
    async with ActorSystem("sources") as system:
        expected, _ = await _train(system, [first, second])
        weights, result = await _train(system, as_lists)
    np.testing.assert_array_equal(weights, expected)
    assert [r.step for r in result.epochs] == [2, 4]


class _StopAfter(FitCallback):
    def __init__(self, stop: StopFlag, step: int) -> None:
        self.stop, self.step = stop, step

    def on_step(self, position: FitPosition, stats: Any, mean_loss: float, rate: float) -> None:
        if position.step == self.step:
            self.stop.request()


@pytest.mark.parametrize("last", [True, False], ids=["last-batch", "mid-epoch"])
async def test_a_stop_on_a_streamed_epochs_last_batch_finishes_the_epoch(last: bool) -> None:
    """A generator's epoch has no count: a stop on its last batch looks one
    batch ahead. Before, the run was "interrupted" at (epoch 1, batch 6),
    its epoch never evaluated or recorded; mid-epoch the batch looked at is
    dropped, and the position is the batch after the one trained."""
    stop = StopFlag()
    step = 12 if last else 10  # 6 batches an epoch
    async with ActorSystem("fit") as system:
        _, result = await _train(system, same_batches_as_arrays, stop=stop,
                                 callbacks=[_StopAfter(stop, step)])  # fmt: skip
    if last:
        assert (result.status, result.position) == ("finished", FitPosition(2, 0, 12))
        assert [r.epoch for r in result.epochs] == [1, 2]
    else:
        assert (result.status, result.position) == ("interrupted", FitPosition(1, 4, 10))
        assert [r.epoch for r in result.epochs] == [1]
