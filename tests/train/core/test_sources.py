"""`as_source` and `batch_bounds` called directly (`fit` checks its own
arguments first): a count of the wrong type or sign is refused by name
when the source is made, and a resume position below 0 when its batches
are asked for, before any batch is read."""

from __future__ import annotations

from typing import Any

import pytest

from atomr.train.core import synthetic_classification
from atomr.train.core.sources import InvalidDataError, as_source, batch_bounds

X, Y = synthetic_classification(10, 3, 2, seed=0)


@pytest.mark.parametrize(
    ("kwargs", "error", "needle"),
    [
        ({"batch_size": True}, TypeError, "batch_size must be an int, got True"),
        ({"batch_size": 2.5}, TypeError, "batch_size must be an int, got 2.5"),
        ({"batch_size": 0}, ValueError, "batch_size must be >= 1, got 0"),
        ({"min_batch_size": 0}, ValueError, "min_batch_size must be >= 1, got 0"),
        ({"seed": -1}, ValueError, "seed must be >= 0, got -1"),
        ({"seed": 1.5}, TypeError, "seed must be an int, got 1.5"),
    ],
)
@pytest.mark.parametrize("data", ["arrays", "batches"])
def test_a_count_of_the_wrong_type_or_sign_is_refused_when_the_source_is_made(
    kwargs: dict[str, Any], error: type, needle: str, data: str
) -> None:
    """`batch_size=True` cut batches of one sample; a float batch size failed
    inside `range`; a negative or float seed was taken, and failed inside
    NumPy at the first batch ('expected non-negative integer')."""
    given: Any = (X, Y) if data == "arrays" else [(X[:5], Y[:5]), (X[5:], Y[5:])]
    args = {"batch_size": 2, "seed": 0, **kwargs}
    with pytest.raises(error) as info:
        as_source("train", given, **args)
    assert needle in str(info.value)


@pytest.mark.parametrize(
    ("args", "error", "needle"),
    [
        ((10, True), TypeError, "batch_size must be an int, got True"),
        ((10, 2.0), TypeError, "batch_size must be an int, got 2.0"),
        ((10, 0, 0), ValueError, "batch_size must be >= 1, got 0"),
        ((-5, 2), ValueError, "n must be >= 0, got -5"),
    ],
)
def test_batch_bounds_refuses_a_count_of_the_wrong_type_or_sign(
    args: tuple[Any, ...], error: type, needle: str
) -> None:
    """`batch_bounds(10, 0, 0)` failed as 'range() arg 3 must not be zero',
    and a negative `n` as a set 'smaller than one batch'."""
    with pytest.raises(error) as info:
        batch_bounds(*args)
    assert needle in str(info.value)


@pytest.mark.parametrize("data", ["arrays", "batches"])
@pytest.mark.parametrize(("epoch", "start"), [(0, -2), (-1, 0), (0, 1.0)])
def test_a_position_below_0_is_refused_when_the_batches_are_asked_for(
    data: str, epoch: Any, start: Any
) -> None:
    """`batches(0, -2)` of a 5-batch epoch yielded 7 batches: the last two
    twice, counted from the epoch's end."""
    given: Any = (X, Y) if data == "arrays" else [(X[:5], Y[:5]), (X[5:], Y[5:])]
    source = as_source("train", given, batch_size=2, seed=0)
    with pytest.raises((TypeError, ValueError), match="epoch must be|start must be"):
        source.batches(epoch, start)
    assert sum(1 for _ in source.batches(0, 1)) == (4 if data == "arrays" else 1)


def test_ragged_nested_lists_are_an_invalid_data_error_naming_the_set() -> None:
    """They failed with NumPy's bare 'setting an array element with a
    sequence', which named neither the set nor the features."""
    with pytest.raises(InvalidDataError, match="validation: features or labels are not an array"):
        as_source("validation", ([[1.0, 2.0], [3.0]], [0, 1]), batch_size=2, seed=0)


def test_a_callable_that_does_not_take_the_epoch_is_refused_when_the_source_is_made() -> None:
    """A generator function of no arguments was taken, and `fit` failed at
    the first batch with a DataSourceError (saving a checkpoint first)."""

    def batches() -> Any:
        yield X, Y

    with pytest.raises(TypeError, match=r"train: a callable must take the epoch .*batches\(\)"):
        as_source("train", batches, batch_size=2, seed=0)
    source = as_source("train", lambda epoch, *rest: batches(), batch_size=2, seed=0)
    assert len(list(source.batches(0, 0))) == 1


def test_a_callable_that_gives_no_iterable_is_an_invalid_data_error() -> None:
    """It was "'NoneType' object is not iterable", inside a DataSourceError."""
    source = as_source("train", lambda epoch: None, batch_size=2, seed=0)
    with pytest.raises(InvalidDataError, match="epoch 0's batches are a NoneType, not an iterable"):
        next(source.batches(0, 0))


class _IncreasingOnly:
    """A dataset whose `get_batch` takes only increasing unique indices, as
    h5py's indexing does."""

    def __init__(self, n: int) -> None:
        self.x, self.y = X[:n], Y[:n]

    def __len__(self) -> int:
        return len(self.y)

    def get_batch(self, indices: Any) -> Any:
        if any(b <= a for a, b in zip(indices[:-1], indices[1:], strict=False)):
            raise TypeError("Indexing elements must be in increasing order")
        return self.x[indices], self.y[indices]


def test_a_one_sample_dataset_is_probed_with_unique_indices() -> None:
    """The probe of the first and last samples asked a one-sample set for
    [0, 0], which h5py-style readers refuse."""
    source = as_source("train", _IncreasingOnly(1), batch_size=1, seed=0)
    assert [len(y) for _, y in source.batches(0, 0)] == [1]
