"""PipelineOptions: the pipeline's own settings, checked when built, and the
default micro-batch size (a quarter of the batch, at least 1)."""

from __future__ import annotations

import numpy as np
import pytest

from atomr.train import Trainer
from atomr.train.pipeline import PipelineOptions, Schedule, StageActor


def test_defaults() -> None:
    options = PipelineOptions()
    assert options.micro_batch_size is None
    assert options.schedule is Schedule.ONE_F_ONE_B
    assert options.split is None and options.stage_class is StageActor


@pytest.mark.parametrize(
    ("batch", "sizes"),
    [(15, [3, 3, 3, 3, 3]), (16, [4, 4, 4, 4]), (3, [1, 1, 1]), (1, [1]), (9, [2, 2, 2, 2, 1])],
)
def test_no_micro_batch_size_means_a_quarter_of_the_batch(batch: int, sizes: list[int]) -> None:
    assert PipelineOptions().micro_batch_sizes(batch) == sizes


def test_an_explicit_micro_batch_size_is_kept() -> None:
    assert PipelineOptions(micro_batch_size=4).micro_batch_sizes(10) == [4, 4, 2]
    assert PipelineOptions(micro_batch_size=32).micro_batch_sizes(10) == [10]


def test_schedule_names_are_parsed() -> None:
    assert PipelineOptions(schedule="gpipe").schedule is Schedule.GPIPE  # type: ignore[arg-type]
    assert PipelineOptions(schedule="1F1B").schedule is Schedule.ONE_F_ONE_B  # type: ignore[arg-type]
    assert PipelineOptions(split=[2, 1]).split == (2, 1)


def test_numpy_integers_are_ints() -> None:
    # the rule of every count argument (`atomr._arguments`): np.int64(2) is an int
    options = PipelineOptions(micro_batch_size=np.int64(2), split=[np.int64(2), np.int32(1)])  # type: ignore[arg-type]
    assert options.micro_batch_size == 2 and type(options.micro_batch_size) is int
    assert options.split == (2, 1) and all(type(c) is int for c in options.split)
    assert options.micro_batch_sizes(5) == [2, 2, 1]


@pytest.mark.parametrize(
    ("error", "match", "kwargs"),
    [
        (ValueError, "micro_batch_size must be >= 1", {"micro_batch_size": 0}),
        (TypeError, "micro_batch_size must be an int", {"micro_batch_size": 2.0}),
        (TypeError, "micro_batch_size must be an int", {"micro_batch_size": True}),
        (ValueError, "unknown schedule", {"schedule": "zero-bubble"}),
        (TypeError, "schedule must be a Schedule", {"schedule": 1}),
        (ValueError, r"split entry \(layers of a stage\) must be >= 1", {"split": [2, 0]}),
        (ValueError, "empty split", {"split": []}),
        (TypeError, "split entry .* must be an int", {"split": [2, "1"]}),
        (TypeError, "split entry .* must be an int", {"split": [2, True]}),
        (TypeError, "split must be a list, tuple or 1-D array of ints", {"split": 3}),
        (TypeError, "split must be a list, tuple or 1-D array of ints", {"split": "21"}),
        (
            TypeError,
            r"1-D array of ints, or None, got an array of shape \(1, 2\)",
            {"split": np.array([[2, 1]])},
        ),
        (TypeError, "split entry .* must be an int", {"split": np.array([2.0, 1.0])}),
        (TypeError, "split entry .* must be an int", {"split": np.array([True, True])}),
        (ValueError, "empty split", {"split": np.array([], dtype=np.int64)}),
        (
            ValueError,
            r"split entry \(layers of a stage\) must be >= 1",
            {"split": np.array([2, 0])},
        ),
        (TypeError, "stage_class must be a StageActor subclass", {"stage_class": Trainer}),
    ],
)
def test_bad_options_are_refused_when_built(
    error: type[Exception], match: str, kwargs: dict[str, object]
) -> None:
    with pytest.raises(error, match=match):
        PipelineOptions(**kwargs)  # type: ignore[arg-type]


def test_a_split_may_be_a_1d_integer_array() -> None:
    """`split=np.array([2, 1])` was refused (an array is no `Sequence`)
    though a list of NumPy integers was taken; it is stored as a tuple of
    ints, whatever the array's integer dtype."""
    for split in (np.array([2, 1]), np.array([2, 1], dtype=np.uint8), (2, 1), [2, 1]):
        options = PipelineOptions(split=split)  # type: ignore[arg-type]
        assert options.split == (2, 1) and all(type(c) is int for c in options.split)
